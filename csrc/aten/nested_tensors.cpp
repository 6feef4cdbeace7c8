// Nested tensors (torch.nested, the transformer fast path's padded batches)
// on flagos.
//
// A nested flagos tensor is PyTorch's NestedTensorImpl over a flagos buffer
// (NestedTensorPrivateUse1). PyTorch makes one for any device without
// dispatching to it (torch.nested.nested_tensor(parts, device="flagos")), and
// native kernels return them (_nested_tensor_from_mask). Operators run the
// native device's kernels for nested tensors (NestedTensorCPU, NestedTensorCUDA;
// layout_routing_kernel, run_native_layout) on a twin: a nested tensor of the
// native device over the native view of the buffer, with the same sizes,
// strides and offsets (metadata, CPU tensors, shared). A nested result comes back the same way: its buffer mapped as any
// result (adopted, or on an argument's storage), wrapped with its metadata.
// PyTorch's device-independent kernels below work on the buffer directly.

#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/to_padded_tensor_native.h>
#include <ATen/ops/unbind_native.h>
#include <ATen/ops/values_native.h>
#include <torch/library.h>

#include "aten/fallback.h"
#include "aten/native_view.h"

namespace torch_fl::aten {

at::Tensor NativeViews::nested_view_of(const at::Tensor& flagos,
                                       std::vector<at::Tensor>& buffers) {
  const auto* nested = at::native::get_nested_tensor_impl(flagos);
  buffers.push_back(nested->get_unsafe_storage_as_tensor());
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      view_of(buffers.back()), nested->get_nested_sizes(), nested->get_nested_strides(),
      nested->get_storage_offsets());
}

at::Tensor NativeViews::nested_to_flagos(const at::Tensor& native, c10::DeviceIndex device) {
  const auto* nested = at::native::get_nested_tensor_impl(native);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      to_flagos(nested->get_unsafe_storage_as_tensor(), device), nested->get_nested_sizes(),
      nested->get_nested_strides(), nested->get_storage_offsets());
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("_to_copy", TORCH_FN(at::native::_to_copy_nested));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_nested));
  m.impl("copy_", TORCH_FN(at::native::copy_nested_));
  m.impl("values", TORCH_FN(at::native::values_nested));
  m.impl("to_padded_tensor", TORCH_FN(at::native::NestedTensor_to_padded_tensor_generic));
  m.impl("unbind.int", TORCH_FN(at::native::NestedTensor_unbind));
  m.impl("_nested_tensor_size", TORCH_FN(at::native::_nested_tensor_size));
  m.impl("_nested_tensor_strides", TORCH_FN(at::native::_nested_tensor_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(at::native::_nested_tensor_storage_offsets));
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_routing_kernel>());
}

}  // namespace torch_fl::aten
