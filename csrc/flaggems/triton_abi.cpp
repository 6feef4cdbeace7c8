#include "flaggems/triton_abi.h"

#include <cstring>
#include <limits>

namespace torch_fl::flaggems::abi {
namespace {

struct TypeName {
  TType type;
  const char* name;
  uint8_t size;
};
constexpr TypeName kTypes[] = {
    {TType::kI1, "i1", 1},    {TType::kI8, "i8", 1},     {TType::kI16, "i16", 2},
    {TType::kI32, "i32", 4},  {TType::kI64, "i64", 8},   {TType::kU1, "u1", 1},
    {TType::kU8, "u8", 1},    {TType::kU16, "u16", 2},   {TType::kU32, "u32", 4},
    {TType::kU64, "u64", 8},  {TType::kFp16, "fp16", 2}, {TType::kBf16, "bf16", 2},
    {TType::kFp32, "fp32", 4}, {TType::kFp64, "fp64", 8},
};

bool is_float(TType t) {
  return t == TType::kFp16 || t == TType::kBf16 || t == TType::kFp32 || t == TType::kFp64;
}

// native_specialize_impl's type for a Python int (bools are handled apart).
TType int_type(int64_t v) {
  return v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max()
             ? TType::kI32
             : TType::kI64;
}

// Python's `v % 16 == 0` (the same in C++ for this test).
Attr int_attr(int64_t v) { return v % 16 == 0 ? Attr::kDiv16 : Attr::kEmpty; }

constexpr uint8_t kDroppedTag = 0x1F;

}  // namespace

const char* type_name(TType t) noexcept {
  for (const auto& e : kTypes) {
    if (e.type == t) return e.name;
  }
  return "?";
}

TType type_from_name(std::string_view name) noexcept {
  if (name == "f32") return TType::kFp32;
  for (const auto& e : kTypes) {
    if (name == e.name) return e.type;
  }
  return TType::kInvalid;
}

size_t scalar_size(TType t) noexcept {
  for (const auto& e : kTypes) {
    if (e.type == t) return e.size;
  }
  return 0;
}

bool Value::operator==(const Value& o) const noexcept {
  if (kind != o.kind) return false;
  switch (kind) {
    case Kind::kPtr:
      return elem == o.elem && ptr == o.ptr;
    case Kind::kInt:
      return i == o.i;
    case Kind::kFloat:
      return std::memcmp(&f, &o.f, sizeof f) == 0;
    case Kind::kBool:
      return b == o.b;
    case Kind::kNone:
      return true;
  }
  return false;
}

bool specialize(const ParamInfo& p, const Value& v, Spec* out) noexcept {
  Spec s;
  if (p.is_constexpr) {
    if (v.kind == Kind::kPtr || v.kind == Kind::kFloat) return false;  // not modelled
    s.dropped = true;
    *out = s;
    return true;
  }
  if (v.kind == Kind::kNone) {  // ("constexpr", None)
    s.dropped = true;
    *out = s;
    return true;
  }
  if (p.is_const) return false;  // "*k" pointers: not used by the kernels served here
  if (p.annotation != TType::kInvalid) {
    // ("ann",) + specialize_impl(...)[1:], or ("ann", None) for floats, bools
    // and do_not_specialize parameters.
    if (v.kind == Kind::kPtr) return false;
    s.type = p.annotation;
    s.attr = Attr::kNone;
    const bool unspecialized = p.annotation == TType::kU1 || is_float(p.annotation) ||
                               p.do_not_specialize;
    if (!unspecialized && v.kind == Kind::kInt && v.i != 1) s.attr = int_attr(v.i);
    *out = s;
    return true;
  }
  switch (v.kind) {
    case Kind::kPtr:
      s.pointer = true;
      s.type = v.elem;
      if (v.elem == TType::kInvalid) return false;
      s.attr = p.do_not_specialize                ? Attr::kNone
               : p.do_not_specialize_on_alignment ? Attr::kEmpty
               : (v.ptr % 16 == 0)                ? Attr::kDiv16
                                                  : Attr::kEmpty;
      break;
    case Kind::kInt:
      if (!p.do_not_specialize && v.i == 1) {
        s.dropped = true;
        break;
      }
      s.type = int_type(v.i);
      s.attr = p.do_not_specialize ? Attr::kNone : int_attr(v.i);
      break;
    case Kind::kFloat:
      s.type = TType::kFp32;
      break;
    case Kind::kBool:
      s.type = TType::kU1;
      break;
    case Kind::kNone:
      break;
  }
  *out = s;
  return true;
}

bool parse_spec(std::string_view type, Attr attr, Spec* out) noexcept {
  Spec s;
  if (type == "constexpr") {
    s.dropped = true;
    *out = s;
    return true;
  }
  if (!type.empty() && type[0] == '*') {
    s.pointer = true;
    type.remove_prefix(1);
  }
  s.type = type_from_name(type);
  if (s.type == TType::kInvalid) return false;
  s.attr = attr;
  *out = s;
  return true;
}

std::string spec_text(const Spec& s) {
  if (s.dropped) return "constexpr";
  std::string t = s.pointer ? "*" : "";
  t += type_name(s.type);
  t += s.attr == Attr::kDiv16 ? ":D" : s.attr == Attr::kEmpty ? ":''" : "";
  return t;
}

bool pack(const ParamInfo* /*params*/, const Value* values, const Spec* specs, int n,
          Packed* out) noexcept {
  int k = 0;
  for (int i = 0; i < n; ++i) {
    const Spec& s = specs[i];
    if (s.dropped) continue;
    if (k >= kMaxParams) return false;
    const Value& v = values[i];
    uint64_t& slot = out->slots[k];
    slot = 0;
    uint8_t size;
    if (s.pointer) {
      if (v.kind != Kind::kPtr) return false;
      slot = v.ptr;
      size = 8;
    } else {
      size = static_cast<uint8_t>(scalar_size(s.type));
      if (is_float(s.type)) {
        double d = v.kind == Kind::kFloat  ? v.f
                   : v.kind == Kind::kInt  ? static_cast<double>(v.i)
                   : v.kind == Kind::kBool ? (v.b ? 1.0 : 0.0)
                                           : 0.0;
        if (s.type == TType::kFp32) {
          float f = static_cast<float>(d);
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          slot = bits;
        } else if (s.type == TType::kFp64) {
          std::memcpy(&slot, &d, 8);
        } else {
          return false;  // fp16/bf16 scalars: no kernel served here takes one
        }
      } else {
        int64_t x = v.kind == Kind::kInt ? v.i : v.kind == Kind::kBool ? (v.b ? 1 : 0) : 0;
        if (v.kind != Kind::kInt && v.kind != Kind::kBool) return false;
        switch (s.type) {
          case TType::kI32:
            if (x < std::numeric_limits<int32_t>::min() ||
                x > std::numeric_limits<int32_t>::max()) {
              return false;
            }
            break;
          case TType::kI1:
          case TType::kI8:
            if (x < -128 || x > 127) return false;
            break;
          case TType::kI16:
            if (x < -32768 || x > 32767) return false;
            break;
          case TType::kU1:
          case TType::kU8:
            if (x < 0 || x > 255) return false;
            break;
          case TType::kU16:
            if (x < 0 || x > 65535) return false;
            break;
          case TType::kU32:
            if (x < 0 || x > 0xFFFFFFFFLL) return false;
            break;
          default:
            break;
        }
        // Little endian: the low bytes of the slot are the value.
        std::memcpy(&slot, &x, 8);
        if (size < 8) slot &= (uint64_t(1) << (8 * size)) - 1;
      }
    }
    out->sizes[k] = size;
    out->params[k] = &slot;
    ++k;
  }
  for (int j = 0; j < kScratchParams; ++j) {
    out->slots[k] = 0;  // no kernel served here uses scratch memory (checked at load)
    out->sizes[k] = 8;
    out->params[k] = &out->slots[k];
    ++k;
  }
  out->count = k;
  return true;
}

bool Key::operator==(const Key& o) const noexcept {
  return hash == o.hash && len == o.len && std::memcmp(bytes, o.bytes, len) == 0;
}

KeyBuilder::KeyBuilder(Key* out, uint16_t fn_id, uint8_t num_warps, uint8_t num_stages) noexcept
    : k_(*out) {
  k_.bytes[0] = static_cast<uint8_t>(fn_id & 0xFF);
  k_.bytes[1] = static_cast<uint8_t>(fn_id >> 8);
  k_.bytes[2] = num_warps;
  k_.bytes[3] = num_stages;
  k_.len = 4;
}

bool KeyBuilder::add(const Spec& s, const Value& v) noexcept {
  if (k_.len + 10 > kMaxKeyBytes) return false;
  uint8_t* p = k_.bytes + k_.len;
  if (s.dropped) {
    p[0] = kDroppedTag;
    p[1] = static_cast<uint8_t>(v.kind);
    uint64_t raw = v.kind == Kind::kBool ? (v.b ? 1 : 0) : v.kind == Kind::kNone ? 0 : v.ptr;
    std::memcpy(p + 2, &raw, 8);
    k_.len += 10;
  } else {
    p[0] = static_cast<uint8_t>(static_cast<uint8_t>(s.type) | (static_cast<uint8_t>(s.attr) << 5) |
                                (s.pointer ? 0x80 : 0));
    k_.len += 1;
  }
  return true;
}

void KeyBuilder::finish() noexcept { k_.hash = hash_bytes(k_.bytes, k_.len); }

uint64_t hash_bytes(const void* data, size_t n, uint64_t seed) noexcept {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace torch_fl::flaggems::abi
