// Triton 3.6's argument specialization and packing (csrc/flaggems/triton_abi.h)
// and FlagGems' launch heuristics (csrc/flaggems/ops/heuristics.h). The
// expected specializations are what triton._C.libtriton.native_specialize_impl
// returns for the same values (measured with triton 3.6.0).

#include <cstring>

#include <gtest/gtest.h>

#include "flaggems/ops/heuristics.h"
#include "flaggems/triton_abi.h"

namespace tabi = torch_fl::flaggems::abi;
namespace heur = torch_fl::flaggems::heur;
using tabi::Attr;
using tabi::TType;
using tabi::Value;

namespace {

tabi::Spec spec(const tabi::ParamInfo& p, const Value& v) {
  tabi::Spec s;
  EXPECT_TRUE(tabi::specialize(p, v, &s));
  return s;
}

std::string text(const tabi::ParamInfo& p, const Value& v) { return tabi::spec_text(spec(p, v)); }

}  // namespace

TEST(TritonAbi, IntegersFollowNativeSpecializeImpl) {
  tabi::ParamInfo plain;
  EXPECT_EQ(text(plain, Value::integer(1)), "constexpr");  // dropped from the kernel
  EXPECT_EQ(text(plain, Value::integer(16)), "i32:D");
  EXPECT_EQ(text(plain, Value::integer(17)), "i32:''");
  EXPECT_EQ(text(plain, Value::integer(0)), "i32:D");
  EXPECT_EQ(text(plain, Value::integer(-16)), "i32:D");
  EXPECT_EQ(text(plain, Value::integer(-1)), "i32:''");
  EXPECT_EQ(text(plain, Value::integer(int64_t{1} << 31)), "i64:D");
  EXPECT_EQ(text(plain, Value::integer((int64_t{1} << 40) + 1)), "i64:''");
  EXPECT_EQ(text(plain, Value::integer(-(int64_t{1} << 31) - 1)), "i64:''");
  tabi::ParamInfo dns;
  dns.do_not_specialize = true;
  EXPECT_EQ(text(dns, Value::integer(1)), "i32");  // not a constexpr, no attribute
  EXPECT_EQ(text(dns, Value::integer(16)), "i32");
  EXPECT_EQ(text(dns, Value::integer(int64_t{1} << 40)), "i64");
}

TEST(TritonAbi, FloatsBoolsNoneAndConstexprs) {
  tabi::ParamInfo plain;
  EXPECT_EQ(text(plain, Value::floating(1.0)), "fp32");
  EXPECT_EQ(text(plain, Value::floating(1.5)), "fp32");
  EXPECT_EQ(text(plain, Value::boolean(true)), "u1");
  EXPECT_EQ(text(plain, Value::none()), "constexpr");
  tabi::ParamInfo ce;
  ce.is_constexpr = true;
  EXPECT_EQ(text(ce, Value::integer(1024)), "constexpr");
  EXPECT_EQ(text(ce, Value::boolean(false)), "constexpr");
  tabi::Spec s;
  EXPECT_FALSE(tabi::specialize(ce, Value::floating(0.5), &s));  // not modelled: decline
}

TEST(TritonAbi, AnnotatedIntsStayParameters) {
  // `x: int` is annotated i32: never turned into a constexpr, no attribute when 1.
  tabi::ParamInfo i32;
  i32.annotation = TType::kI32;
  EXPECT_EQ(text(i32, Value::integer(1)), "i32");
  EXPECT_EQ(text(i32, Value::integer(32)), "i32:D");
  EXPECT_EQ(text(i32, Value::integer(33)), "i32:''");
  tabi::ParamInfo f32;
  f32.annotation = TType::kFp32;
  EXPECT_EQ(text(f32, Value::floating(2.0)), "fp32");
}

TEST(TritonAbi, PointersByAlignment) {
  tabi::ParamInfo plain;
  EXPECT_EQ(text(plain, Value::pointer(0x7f0000000000, TType::kFp32)), "*fp32:D");
  EXPECT_EQ(text(plain, Value::pointer(0x7f0000000004, TType::kBf16)), "*bf16:''");
  tabi::ParamInfo no_align;
  no_align.do_not_specialize_on_alignment = true;
  EXPECT_EQ(text(no_align, Value::pointer(0x7f0000000000, TType::kFp16)), "*fp16:''");
  tabi::ParamInfo dns;
  dns.do_not_specialize = true;
  EXPECT_EQ(text(dns, Value::pointer(0x7f0000000000, TType::kI64)), "*i64");
  tabi::Spec s;
  EXPECT_FALSE(tabi::specialize(plain, Value::pointer(0x1000, TType::kInvalid), &s));
}

TEST(TritonAbi, ParseSpecRoundTrips) {
  tabi::Spec s;
  ASSERT_TRUE(tabi::parse_spec("*fp32", Attr::kDiv16, &s));
  EXPECT_TRUE(s.pointer);
  EXPECT_EQ(s.type, TType::kFp32);
  ASSERT_TRUE(tabi::parse_spec("constexpr", Attr::kNone, &s));
  EXPECT_TRUE(s.dropped);
  EXPECT_FALSE(tabi::parse_spec("nvTmaDesc", Attr::kNone, &s));
}

TEST(TritonAbi, PackFollowsTheLauncher) {
  tabi::ParamInfo p[6];
  Value v[6] = {Value::pointer(0x1000, TType::kFp32), Value::integer(1), Value::integer(70000),
                Value::floating(0.1), Value::boolean(true), Value::integer(int64_t{1} << 40)};
  p[4].is_constexpr = false;
  tabi::Spec s[6];
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(tabi::specialize(p[i], v[i], &s[i]));
  tabi::Packed packed;
  ASSERT_TRUE(tabi::pack(p, v, s, 6, &packed));
  // The constexpr 1 is gone; two scratch pointers close the list.
  ASSERT_EQ(packed.count, 5 + tabi::kScratchParams);
  const uint8_t sizes[] = {8, 4, 4, 1, 8, 8, 8};
  for (int i = 0; i < packed.count; ++i) EXPECT_EQ(packed.sizes[i], sizes[i]) << i;
  EXPECT_EQ(*static_cast<uint64_t*>(packed.params[0]), 0x1000u);
  EXPECT_EQ(*static_cast<int32_t*>(packed.params[1]), 70000);
  float f;
  std::memcpy(&f, packed.params[2], 4);
  EXPECT_EQ(f, 0.1f);  // a Python float goes to the kernel as float32
  EXPECT_EQ(*static_cast<uint8_t*>(packed.params[3]), 1);
  EXPECT_EQ(*static_cast<int64_t*>(packed.params[4]), int64_t{1} << 40);
  EXPECT_EQ(*static_cast<uint64_t*>(packed.params[5]), 0u);  // scratch
}

TEST(TritonAbi, PackRejectsOutOfRange) {
  tabi::ParamInfo p;
  p.annotation = TType::kI32;  // `stride: int` with a stride beyond int32
  Value v = Value::integer(int64_t{1} << 33);
  tabi::Spec s;
  ASSERT_TRUE(tabi::specialize(p, v, &s));
  tabi::Packed packed;
  EXPECT_FALSE(tabi::pack(&p, &v, &s, 1, &packed));
}

TEST(TritonAbi, KeysSeparateSpecializations) {
  tabi::ParamInfo p[2];
  auto key = [&](Value a, Value b, uint8_t warps) {
    tabi::Key k;
    tabi::KeyBuilder kb(&k, 7, warps, 3);
    Value vals[2] = {a, b};
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(kb.add(spec(p[i], vals[i]), vals[i]));
    kb.finish();
    return k;
  };
  const Value ptr = Value::pointer(0x1000, TType::kFp32);
  // Values that specialize alike share a key: one compiled kernel.
  EXPECT_TRUE(key(ptr, Value::integer(32), 4) == key(Value::pointer(0x2000, TType::kFp32), Value::integer(48), 4));
  EXPECT_FALSE(key(ptr, Value::integer(32), 4) == key(ptr, Value::integer(33), 4));    // D vs ''
  EXPECT_FALSE(key(ptr, Value::integer(1), 4) == key(ptr, Value::integer(17), 4));     // constexpr 1
  EXPECT_FALSE(key(ptr, Value::integer(32), 4) == key(ptr, Value::integer(32), 8));    // warps
  EXPECT_FALSE(key(ptr, Value::integer(2), 4) == key(Value::pointer(0x1000, TType::kBf16), Value::integer(2), 4));
  EXPECT_FALSE(key(ptr, Value::integer(32), 4) == key(ptr, Value::integer(int64_t{1} << 32), 4));  // i64
}

TEST(FlagGemsHeuristics, PowersAndTiles) {
  EXPECT_EQ(heur::next_pow2(0), 0);
  EXPECT_EQ(heur::next_pow2(1), 1);
  EXPECT_EQ(heur::next_pow2(5), 8);
  EXPECT_EQ(heur::next_pow2(1024), 1024);
  EXPECT_EQ(heur::cdiv(1000, 256), 4);
  // heuristics_for_tile_size(256, 64, 1024) == (1, 256); (256, 3, 7, 33) == (2, 2, 64)
  int64_t tiles[3];
  const int64_t s2[] = {64, 1024};
  heur::tile_sizes(256, s2, 2, tiles);
  EXPECT_EQ(tiles[0], 1);
  EXPECT_EQ(tiles[1], 256);
  const int64_t s3[] = {3, 7, 33};
  heur::tile_sizes(256, s3, 3, tiles);
  EXPECT_EQ(tiles[0], 1);
  EXPECT_EQ(tiles[1], 4);
  EXPECT_EQ(tiles[2], 64);
  EXPECT_EQ(heur::warps_by_tile(256), 4);
  EXPECT_EQ(heur::warps_by_tile(2048), 8);
  EXPECT_EQ(heur::warps_by_tile(4096), 16);
}

TEST(FlagGemsHeuristics, ReductionTiles) {
  // H100: 132 SMs.
  EXPECT_EQ(heur::tile_n_inner(1000), 1024);
  EXPECT_EQ(heur::tile_n_inner(151936), 4096);
  EXPECT_EQ(heur::softmax_tile_k(8, 64, 132), 4);     // 512, 256 blocks over 132 SMs: grows twice
  EXPECT_EQ(heur::softmax_tile_k(1, 64, 132), 1);     // 64 blocks: one wave
  EXPECT_EQ(heur::mean_tile_k(1, 100, 132), 1);
  EXPECT_EQ(heur::mean_tile_n(100, 1), 128);
  EXPECT_EQ(heur::mean_tile_n(5000, 4), 1024);
  EXPECT_EQ(heur::argmax_tile_k(64, 512, true, 132), 64);
  EXPECT_EQ(heur::argmax_tile_k(2, 100, false, 132), 64);
  EXPECT_EQ(heur::argmax_tile_n(100, 64), 100);  // not a power of two: FlagGems' kernel fails
  EXPECT_EQ(heur::argmax_tile_n(3000, 64), 512);
  EXPECT_EQ(heur::argmax_warps(512, true), 4);
  EXPECT_EQ(heur::argmax_warps(512, false), 8);
  EXPECT_EQ(heur::index_select_block_m(1000), 1);
  EXPECT_EQ(heur::index_select_block_n(1000), 64);
}
