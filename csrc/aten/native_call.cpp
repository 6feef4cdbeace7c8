#include "aten/native_call.h"

#include "runtime/generator.h"

namespace torch_fl::aten {

void NativeCall::mismatch(c10::DeviceIndex d) const {
  TORCH_CHECK(false,
              "Expected all tensors to be on the same device, but found at least two "
              "devices, flagos:", static_cast<int>(device_), " and flagos:", static_cast<int>(d),
              " (in ", op_.schema().operator_name(), ")");
}

void NativeCall::finish_arguments() {
  if (device_ == -1) {
    device_ = runtime::current_device();
    no_flagos_argument_ = true;
    return;
  }
  // A non-flagos tensor among flagos arguments is accepted where CUDA accepts
  // one among CUDA arguments: a 0-dim CPU scalar, an index in a Tensor?[]
  // list, or a nested tensor's metadata (sizes, strides, offsets: CPU tensors
  // on every device) given to an operator of the nested family
  // (_nested_from_padded in the backward of to_padded_tensor), whose kernel
  // checks its arguments itself.
  for (const auto& [t, index_list] : foreign_) {
    if (index_list || (t->device_type() == c10::DeviceType::CPU && t->dim() == 0)) continue;
    if (t->device_type() == c10::DeviceType::CPU &&
        op_.schema().name().starts_with("aten::_nested_")) {
      continue;
    }
    TORCH_CHECK(false,
                "Expected all tensors to be on the same device, but found at least two "
                "devices, ", c10::Device(runtime::kFlagos, device_), " and ", t->device(),
                "! (in ", op_.schema().operator_name(), ")");
  }
}

at::Generator NativeCall::generator(const std::optional<at::Generator>& gen) const {
  // The dispatcher picked flagos from the generator alone: the tensors are
  // another device's (the CPU's, for a factory given no device).
  if (no_flagos_argument_ && gen.has_value() && gen->defined() &&
      gen->device().type() == runtime::kFlagos) {
    const c10::DeviceType tensors =
        foreign_.empty() ? c10::DeviceType::CPU : foreign_.front().first->device_type();
    TORCH_CHECK(false, "Expected a '", c10::DeviceTypeName(tensors, /*lower_case=*/true),
                "' device type for generator but found 'flagos' (in ",
                op_.schema().operator_name(),
                "): no flagos tensor or device is among the arguments. Pass a generator of "
                "the tensors' device, or make the tensors on flagos.");
  }
  return runtime::native_generator(gen, device_);
}

c10::DispatchKeySet NativeCall::native_keys() noexcept {
  static const c10::DispatchKeySet keys(NativeViews::native_key());
  return keys;
}

}  // namespace torch_fl::aten
