#pragma once

// Triton 3.6's calling convention for a compiled kernel, in C++: how
// JITFunction's binder specializes each argument (which selects the compiled
// kernel), and how its generated launcher packs the arguments for
// cuLaunchKernelEx. Everything Triton-version-specific in csrc/flaggems/ is
// here; registration checks the Triton version against kTritonVersion and
// every loaded kernel's parameter list against pack() (cuFuncGetParamInfo),
// so another Triton fails loudly instead of launching with a wrong ABI.
//
// No torch dependency: unit-tested on its own (tests/cpp/test_triton_abi.cpp).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace torch_fl::flaggems::abi {

// The Triton version whose rules this file implements.
inline constexpr std::string_view kTritonVersion = "3.6";

// Scalar types as Triton names them ("fp32", "i64", "u1", ...).
enum class TType : uint8_t {
  kInvalid = 0,
  kI1, kI8, kI16, kI32, kI64,
  kU1, kU8, kU16, kU32, kU64,
  kFp16, kBf16, kFp32, kFp64,
};
const char* type_name(TType t) noexcept;
// "fp32" -> kFp32; kInvalid for names this file does not handle.
TType type_from_name(std::string_view name) noexcept;
// Bytes of the C type the launcher passes for a scalar of this type.
size_t scalar_size(TType t) noexcept;

// A parameter as Triton's KernelParam describes it (exported from Python once
// per JITFunction).
struct ParamInfo {
  bool is_constexpr = false;
  bool do_not_specialize = false;
  bool do_not_specialize_on_alignment = false;
  bool is_const = false;  // a `const` pointer annotation ("*k...")
  // KernelParam.annotation_type as a scalar type ("i32" for `x: int`), or
  // kInvalid when the parameter has none (or one Triton ignores: tl.tensor).
  TType annotation = TType::kInvalid;
};

// One argument as the Python wrapper passes it: a tensor (its data pointer and
// element type), a Python int, float or bool, or None. Constexpr parameters
// get their value here too.
enum class Kind : uint8_t { kPtr, kInt, kFloat, kBool, kNone };
struct Value {
  Kind kind;
  TType elem;  // element type of a kPtr
  union {
    uint64_t ptr;
    int64_t i;
    double f;
    bool b;
  };
  // Trivial on purpose: plans hold arrays of values on the stack, per call.
  Value() noexcept = default;
  static Value pointer(uint64_t p, TType elem) noexcept {
    Value v = of(Kind::kPtr, elem);
    v.ptr = p;
    return v;
  }
  static Value integer(int64_t x) noexcept {
    Value v = of(Kind::kInt);
    v.i = x;
    return v;
  }
  static Value floating(double x) noexcept {
    Value v = of(Kind::kFloat);
    v.f = x;
    return v;
  }
  static Value boolean(bool x) noexcept {
    Value v = of(Kind::kBool);
    v.b = x;
    return v;
  }
  static Value none() noexcept { return of(Kind::kNone); }
  bool operator==(const Value& o) const noexcept;

 private:
  // The payload zeroed first, so that a bool or None carries no stale bytes
  // (the disk cache writes values whole).
  static Value of(Kind kind, TType elem = TType::kInvalid) noexcept {
    Value v;
    v.kind = kind;
    v.elem = elem;
    v.ptr = 0;
    return v;
  }
};

// Triton's specialization attribute: None, '' or 'D' (divisible by 16).
enum class Attr : uint8_t { kNone = 0, kEmpty = 1, kDiv16 = 2 };

// What the binder makes of one argument.
struct Spec {
  bool dropped = false;  // a constexpr (declared, or an int specialized to 1, or None)
  bool pointer = false;
  TType type = TType::kInvalid;  // element type for pointers
  Attr attr = Attr::kNone;
  bool operator==(const Spec& o) const noexcept {
    return dropped == o.dropped && pointer == o.pointer && type == o.type && attr == o.attr;
  }
};

// The binder's rule for `value` passed to `param` (triton/runtime/jit.py
// create_function_from_signature + native_specialize_impl). Returns false
// when Triton would reject the value or this file does not model it (a float
// for a constexpr, an annotation it does not handle): callers decline.
bool specialize(const ParamInfo& param, const Value& value, Spec* out) noexcept;

// Parses one entry of Triton's specialization as Python prints it:
// type "*fp32", "i32", "constexpr"; attr "D", "" or none. For tests and for
// checking a captured launch against a plan.
bool parse_spec(std::string_view type, Attr attr, Spec* out) noexcept;
std::string spec_text(const Spec& s);

// The arguments of one launch, packed as Triton's launcher packs them: one
// slot per non-constexpr parameter in declaration order, then the two scratch
// pointers (global, profile) Triton 3.6 appends to every kernel.
inline constexpr int kMaxParams = 64;
inline constexpr int kScratchParams = 2;
struct Packed {
  alignas(16) uint64_t slots[kMaxParams + kScratchParams];
  void* params[kMaxParams + kScratchParams];
  uint8_t sizes[kMaxParams + kScratchParams];
  int count = 0;
};
// Packs `values` for parameters `params` (n of each) whose specializations are
// `specs`. False when a value does not fit its C type (an i32 out of range).
bool pack(const ParamInfo* params, const Value* values, const Spec* specs, int n,
          Packed* out) noexcept;

// ---- kernel keys -------------------------------------------------------------
// A compiled kernel's identity as bytes: the JIT function, launch options and
// every argument's specialization (constexpr values included). Two calls with
// equal keys run the same binary. Built per call on the hot path: no heap.
inline constexpr int kMaxKeyBytes = 8 + kMaxParams * 10;
struct Key {
  uint16_t len = 0;
  uint64_t hash = 0;
  uint8_t bytes[kMaxKeyBytes];
  bool operator==(const Key& o) const noexcept;
};
class KeyBuilder {
 public:
  // Writes into *out (no copy of the key afterwards).
  KeyBuilder(Key* out, uint16_t fn_id, uint8_t num_warps, uint8_t num_stages) noexcept;
  // Adds one parameter: its spec, and for a dropped one its value.
  bool add(const Spec& spec, const Value& value) noexcept;
  void finish() noexcept;

 private:
  Key& k_;
};

// 64-bit FNV-1a, the key hash (and the disk cache's file names, with a second seed).
uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0xcbf29ce484222325ULL) noexcept;

}  // namespace torch_fl::flaggems::abi
