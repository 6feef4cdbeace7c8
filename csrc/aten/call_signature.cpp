#include "aten/call_signature.h"

#include <set>
#include <sstream>

#include <ATen/core/jit_type.h>

namespace torch_fl::aten {
namespace {

constexpr size_t kListedTensors = 4;  // longer tensor lists are summarised

const char* dtype_text(at::ScalarType t) {
  switch (t) {
    case at::kDouble: return "f64";
    case at::kFloat: return "f32";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kLong: return "i64";
    case at::kInt: return "i32";
    case at::kShort: return "i16";
    case at::kChar: return "i8";
    case at::kByte: return "u8";
    case at::kBool: return "b8";
    case at::kComplexFloat: return "c64";
    case at::kComplexDouble: return "c128";
    default: return c10::toString(t);
  }
}

void list_text(std::ostream& os, c10::IntArrayRef v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}

void tensor_text(std::ostream& os, const at::Tensor& t) {
  if (!t.defined()) {
    os << "None";
    return;
  }
  os << dtype_text(t.scalar_type());
  list_text(os, t.sizes());
  if (!t.is_contiguous() && t.numel() > 1) {
    os << '{';
    for (int64_t i = 0; i < t.dim(); ++i) os << (i ? ", " : "") << t.stride(i);
    os << '}';
  }
  if (t.device().type() != c10::DeviceType::PrivateUse1) os << '@' << t.device();
}

void tensors_text(std::ostream& os, const std::vector<std::optional<at::Tensor>>& list) {
  if (list.size() <= kListedTensors) {
    os << '[';
    for (size_t i = 0; i < list.size(); ++i) {
      if (i) os << ", ";
      if (list[i].has_value()) tensor_text(os, *list[i]); else os << "None";
    }
    os << ']';
    return;
  }
  std::set<std::string> dtypes;
  int64_t numel = 0;
  for (const auto& t : list) {
    if (!t.has_value() || !t->defined()) continue;
    dtypes.insert(dtype_text(t->scalar_type()));
    numel += t->numel();
  }
  os << '[' << list.size() << " tensors ";
  bool first = true;
  for (const auto& d : dtypes) {
    os << (first ? "" : "/") << d;
    first = false;
  }
  os << ", " << numel << " elements]";
}

// A boxed dtype, layout or memory format is an int: the schema says which.
void value_text(std::ostream& os, const c10::Argument& arg, const c10::IValue& v) {
  if (v.isInt()) {
    c10::TypePtr type = arg.real_type();
    if (auto opt = type->castRaw<c10::OptionalType>()) type = opt->getElementType();
    switch (type->kind()) {
      case c10::TypeKind::ScalarTypeType:
        os << dtype_text(v.toScalarType());
        return;
      case c10::TypeKind::LayoutType:
        os << v.toLayout();
        return;
      case c10::TypeKind::MemoryFormatType:
        os << v.toMemoryFormat();
        return;
      default:
        break;
    }
  }
  if (v.isBool()) {
    os << (v.toBool() ? "True" : "False");
  } else if (v.isString()) {
    os << '\'' << v.toStringRef() << '\'';
  } else {
    os << v;
  }
}

}  // namespace

std::string call_signature(const OpPlan& plan, const c10::IValue* args) {
  std::ostringstream os;
  const std::string& name = plan.name;
  os << (name.rfind("aten::", 0) == 0 ? name.substr(6) : name) << '(';
  const auto& schema_args = plan.schema->arguments();
  for (size_t i = 0; i < plan.num_arguments; ++i) {
    if (i) os << ", ";
    const c10::IValue& v = args[i];
    if (v.isTensor()) {
      tensor_text(os, v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<std::optional<at::Tensor>> list;
      for (const at::Tensor& t : v.toTensorList()) list.emplace_back(t);
      tensors_text(os, list);
    } else if (v.isOptionalTensorList()) {
      std::vector<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) list.push_back(t);
      tensors_text(os, list);
    } else {
      os << schema_args[i].name() << '=';
      value_text(os, schema_args[i], v);
    }
  }
  os << ')';
  return os.str();
}

}  // namespace torch_fl::aten
