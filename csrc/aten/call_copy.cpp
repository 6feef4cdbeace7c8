#include "aten/call_copy.h"

#include <algorithm>

#include <ATen/EmptyTensor.h>
#include <ATen/core/enum_tag.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/TensorImpl.h>

#include "aten/native_view.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/storage.h"
#include "runtime/stream.h"

namespace torch_fl::aten {
namespace {

using runtime::kFlagos;

bool is_flagos(const at::Tensor& t) { return t.defined() && t.device().type() == kFlagos; }

// Calls f(tensor, is_write) for every tensor among the arguments.
template <class F>
void for_each_tensor(const OpPlan& plan, const c10::IValue* args, F&& f) {
  for (const ArgSlot& slot : plan.slots) {
    const c10::IValue& v = args[slot.index];
    if (slot.kind == ArgKind::kTensor) {
      if (v.isTensor()) f(v.toTensor(), slot.is_write);
    } else if (slot.kind == ArgKind::kTensorList) {
      if (!v.isTensorList()) continue;
      for (const at::Tensor& t : v.toTensorList()) f(t, slot.is_write);
    } else if (slot.kind == ArgKind::kOptionalTensorList) {
      if (!v.isOptionalTensorList()) continue;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) f(*t, slot.is_write);
      }
    }
  }
}

// The bytes [first, end) of its storage a tensor can reach; {0, 0} if none.
std::pair<int64_t, int64_t> extent(const at::Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  const size_t item = t.dtype().itemsize();
  const size_t end = at::detail::computeStorageNbytes(t.sizes(), t.strides(), item,
                                                      t.storage_offset());
  return {t.storage_offset() * static_cast<int64_t>(item), static_cast<int64_t>(end)};
}

// The tensors of one storage: the copy covers the bytes they reach, from a
// 16-byte boundary so that every element size divides each copy's offset.
struct Group {
  c10::StorageImpl* storage;
  c10::DeviceIndex device;
  int64_t lo = INT64_MAX;
  int64_t hi = 0;
  c10::Storage copy;
};

std::vector<Group> group_by_storage(const OpPlan& plan, const c10::IValue* args) {
  std::vector<Group> groups;
  for_each_tensor(plan, args, [&](const at::Tensor& t, bool) {
    if (!is_flagos(t) || t.numel() == 0) return;
    auto [lo, hi] = extent(t);
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.storage == s; });
    if (it == groups.end()) {
      groups.push_back(Group{s, t.device().index()});
      it = groups.end() - 1;
    }
    it->lo = std::min(it->lo, lo / 16 * 16);
    it->hi = std::max(it->hi, hi);
  });
  return groups;
}

// A tensor over `storage` with the geometry of `like`, its offset moved by
// `shift` bytes.
at::Tensor on_storage(const c10::Storage& storage, const at::Tensor& like, int64_t shift,
                      CopyTarget target) {
  const int64_t offset =
      like.storage_offset() - shift / static_cast<int64_t>(like.dtype().itemsize());
  at::Tensor t;
  if (target == CopyTarget::kFlagos) {
    t = flagos_tensor_on(storage, like);
    t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(), offset);
    return t;
  }
  t = at::empty({0}, at::TensorOptions().dtype(like.dtype()).device(storage.device()));
  t.set_(storage, offset, like.sizes(), like.strides());
  if (like.is_conj()) t.unsafeGetTensorImpl()->_set_conj(true);
  if (like.is_neg()) t.unsafeGetTensorImpl()->_set_neg(true);
  return t;
}

}  // namespace

std::vector<c10::IValue> copy_arguments(const OpPlan& plan, const c10::IValue* args,
                                        CopyTarget target) {
  std::vector<Group> groups = group_by_storage(plan, args);
  for (Group& g : groups) {
    const size_t nbytes = static_cast<size_t>(g.hi - g.lo);
    if (target == CopyTarget::kFlagos) {
      g.copy = c10::Storage(runtime::allocate_flagos_storage(g.device, nbytes));
    } else {
      g.copy = at::empty({static_cast<int64_t>(nbytes)},
                         at::TensorOptions().dtype(at::kByte).device(NativeViews::native_device(g.device)))
                   .storage();
    }
    // A driver copy on the current stream: ordered before anything that
    // runs on the copy, and nothing on the routing path sees it.
    runtime::driver().copy(g.copy.mutable_data(),
                           static_cast<const char*>(g.storage->data()) + g.lo, nbytes,
                           hal::CopyKind::kDeviceToDevice,
                           runtime::current_stream_handle(g.device), /*async=*/true);
  }
  auto copy = [&](const at::Tensor& t, bool is_write) -> at::Tensor {
    // A tensor of another device is shared, unless the kernel may write it.
    if (!is_flagos(t)) return is_write && t.defined() ? t.clone(at::MemoryFormat::Preserve) : t;
    if (t.numel() == 0) {
      auto opts = at::TensorOptions().dtype(t.dtype()).device(
          target == CopyTarget::kFlagos ? t.device() : NativeViews::native_device(t.device().index()));
      return at::empty_strided(t.sizes(), t.strides(), opts);
    }
    c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    for (const Group& g : groups) {
      if (g.storage == s) return on_storage(g.copy, t, g.lo, target);
    }
    TORCH_INTERNAL_ASSERT(false, "copy_arguments: a tensor without its storage group");
  };

  std::vector<c10::IValue> out(args, args + plan.num_arguments);
  for (const ArgSlot& slot : plan.slots) {
    c10::IValue& v = out[slot.index];
    switch (slot.kind) {
      case ArgKind::kTensor:
        if (v.isTensor()) v = copy(v.toTensor(), slot.is_write);
        break;
      case ArgKind::kTensorList: {
        if (!v.isTensorList()) break;
        c10::List<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorList()) list.push_back(copy(t, slot.is_write));
        v = std::move(list);
        break;
      }
      case ArgKind::kOptionalTensorList: {
        if (!v.isOptionalTensorList()) break;
        c10::List<std::optional<at::Tensor>> list;
        for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
          list.push_back(t.has_value() ? std::optional<at::Tensor>(copy(*t, slot.is_write))
                                       : std::nullopt);
        }
        v = std::move(list);
        break;
      }
      case ArgKind::kDevice:
        if (target == CopyTarget::kNative && v.isDevice() && v.toDevice().type() == kFlagos) {
          const c10::Device d = v.toDevice();
          v = c10::IValue(NativeViews::native_device(runtime::resolve_device(d.has_index() ? d.index() : -1)));
        }
        break;
      case ArgKind::kGenerator:
        break;
    }
  }
  return out;
}

std::vector<at::Tensor> written_tensors(const OpPlan& plan, const c10::IValue* args) {
  std::vector<at::Tensor> out;
  for_each_tensor(plan, args, [&](const at::Tensor& t, bool is_write) {
    if (is_write) out.push_back(t);
  });
  return out;
}

std::vector<std::string> written_labels(const OpPlan& plan, const c10::IValue* args) {
  std::vector<std::string> out;
  const auto& schema_args = plan.schema->arguments();
  for (const ArgSlot& slot : plan.slots) {
    if (!slot.is_write) continue;
    const c10::IValue& v = args[slot.index];
    const std::string name = "argument '" + schema_args[slot.index].name() + "'";
    if (slot.kind == ArgKind::kTensor) {
      if (v.isTensor()) out.push_back(name);
    } else if (slot.kind == ArgKind::kTensorList && v.isTensorList()) {
      for (size_t i = 0; i < v.toTensorList().size(); ++i) {
        out.push_back(name + "[" + std::to_string(i) + "]");
      }
    } else if (slot.kind == ArgKind::kOptionalTensorList && v.isOptionalTensorList()) {
      size_t i = 0;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) out.push_back(name + "[" + std::to_string(i) + "]");
        ++i;
      }
    }
  }
  return out;
}

size_t argument_bytes(const OpPlan& plan, const c10::IValue* args) {
  size_t total = 0;
  for (const Group& g : group_by_storage(plan, args)) total += static_cast<size_t>(g.hi - g.lo);
  return total;
}

c10::DeviceIndex call_device(const OpPlan& plan, const c10::IValue* args) {
  c10::DeviceIndex found = -1;
  for_each_tensor(plan, args, [&](const at::Tensor& t, bool) {
    if (found == -1 && is_flagos(t)) found = t.device().index();
  });
  if (found != -1) return found;
  for (const ArgSlot& slot : plan.slots) {
    const c10::IValue& v = args[slot.index];
    if (slot.kind == ArgKind::kDevice && v.isDevice() && v.toDevice().type() == kFlagos) {
      const c10::Device d = v.toDevice();
      return runtime::resolve_device(d.has_index() ? d.index() : -1);
    }
  }
  return runtime::current_device();
}

bool is_random(const c10::OperatorHandle& op, const OpPlan& plan, const c10::IValue* args) {
  for (const ArgSlot& slot : plan.slots) {
    if (slot.kind == ArgKind::kGenerator) return true;
  }
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return false;
  const auto& schema_args = plan.schema->arguments();
  for (size_t i = 0; i < schema_args.size(); ++i) {
    if (schema_args[i].name() == "dropout_p" && args[i].isDouble()) {
      return args[i].toDouble() != 0.0;
    }
  }
  return true;
}

void drop_rng_state(const c10::OperatorHandle& op, std::vector<c10::IValue>& outputs) {
  if (!op.hasTag(at::Tag::nondeterministic_seeded)) return;
  for (c10::IValue& v : outputs) {
    if (v.isTensor() && v.toTensor().defined() &&
        c10::isIntegralType(v.toTensor().scalar_type(), /*includeBool=*/true)) {
      v = c10::IValue();
    }
  }
}

std::string error_text(const std::exception& e) {
  if (auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string rerun_skip_reason(const c10::OperatorHandle& op, const OpPlan& plan,
                              const c10::IValue* args) {
  if (plan.name.rfind("aten::", 0) != 0) {
    return "not an aten operator: never run twice (it may be a collective)";
  }
  if (is_random(op, plan, args)) {
    return "random operator: a second run would move the workload's random stream";
  }
  if (runtime::uses_cuda() && runtime::cuda::capturing()) {
    return "called during CUDA graph capture (nothing may wait for the device)";
  }
  return "";
}

std::vector<std::string> output_labels(const OpPlan& plan,
                                       const std::vector<std::string>& written) {
  std::vector<std::string> labels;
  for (size_t i = 0; i < plan.num_returns; ++i) labels.push_back("result " + std::to_string(i));
  labels.insert(labels.end(), written.begin(), written.end());
  return labels;
}

std::vector<c10::IValue> call_outputs(const c10::OperatorHandle& op, const OpPlan& plan,
                                      const torch::jit::Stack& stack,
                                      const std::vector<at::Tensor>& written) {
  std::vector<c10::IValue> out(stack.end() - plan.num_returns, stack.end());
  for (const at::Tensor& t : written) out.emplace_back(t);
  drop_rng_state(op, out);
  return out;
}

}  // namespace torch_fl::aten
