#include "aten/op_plan.h"

#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <ATen/core/jit_type.h>
#include <c10/util/flat_hash_map.h>

namespace torch_fl::aten {
namespace {

std::optional<ArgKind> kind_of(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->castRaw<c10::OptionalType>()) t = opt->getElementType();
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      return ArgKind::kTensor;
    case c10::TypeKind::DeviceObjType:
      return ArgKind::kDevice;
    case c10::TypeKind::GeneratorType:
      return ArgKind::kGenerator;
    case c10::TypeKind::ListType: {
      auto elem = t->castRaw<c10::ListType>()->getElementType();
      if (elem->kind() == c10::TypeKind::TensorType) return ArgKind::kTensorList;
      if (auto eo = elem->castRaw<c10::OptionalType>()) {
        if (eo->getElementType()->kind() == c10::TypeKind::TensorType)
          return ArgKind::kOptionalTensorList;
      }
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

std::unique_ptr<OpPlan> build_plan(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  auto plan = std::make_unique<OpPlan>();
  plan->schema = &schema;
  const auto& opname = schema.operator_name();
  plan->name = opname.name;
  if (!opname.overload_name.empty()) plan->name += "." + opname.overload_name;
  plan->num_arguments = static_cast<uint16_t>(schema.arguments().size());
  plan->num_returns = static_cast<uint16_t>(schema.returns().size());
  plan->host_kernel = host_parity_kernel(op);
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& arg = schema.arguments()[i];
    auto kind = kind_of(arg.type());
    if (!kind) continue;
    bool is_write = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
    plan->slots.push_back({static_cast<uint16_t>(i), *kind, is_write});
  }
  return plan;
}

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, std::unique_ptr<OpPlan>> plans;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: plans outlive every caller
  return *r;
}

}  // namespace

std::string op_key(const c10::OperatorName& name) {
  std::string key = name.name.rfind("aten::", 0) == 0 ? name.name.substr(6) : name.name;
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  return key;
}

c10::OperatorName aten_operator_name(std::string_view key) {
  if (key.rfind("aten::", 0) == 0) key.remove_prefix(6);
  const size_t dot = key.find('.');
  return c10::OperatorName(
      "aten::" + std::string(key.substr(0, dot)),
      dot == std::string_view::npos ? std::string() : std::string(key.substr(dot + 1)));
}

OpPlan& plan_for(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  thread_local ska::flat_hash_map<const void*, OpPlan*> cache;
  auto hit = cache.find(key);
  if (hit != cache.end()) return *hit->second;

  auto& r = registry();
  OpPlan* plan;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto& slot = r.plans[key];
    if (!slot) slot = build_plan(op);
    plan = slot.get();
  }
  cache.emplace(key, plan);
  return *plan;
}

void for_each_plan(const std::function<void(OpPlan&)>& f) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [key, plan] : r.plans) f(*plan);
}

}  // namespace torch_fl::aten
