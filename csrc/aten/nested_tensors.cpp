// Nested tensors (torch.nested) on flagos: the conversions that bring their
// data back.
//
// PyTorch builds a nested tensor for any device without dispatching to it
// (torch.nested.nested_tensor(parts, device="flagos"), as_nested_tensor of
// flagos parts): its buffer is an ordinary flagos tensor, and flagos cannot
// refuse one where it is made. Every operator that needs a kernel of the
// layout's own is refused (strided_only.cpp), but these are PyTorch's
// device-independent ones, which work on the buffer: with them `.cpu()`,
// `.to(...)`, `to_padded_tensor` and `unbind` work, as on CUDA.

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

namespace torch_fl::aten {

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

}  // namespace torch_fl::aten
