// Sparse compressed tensors (CSR, CSC, BSR, BSC: to_sparse_csr(),
// torch.sparse.mm over a CSR matrix) on flagos.
//
// A sparse compressed flagos tensor is PyTorch's SparseCsrTensorImpl whose
// compressed indices, plain indices and values are flagos tensors
// (SparseCsrPrivateUse1). PyTorch makes one for any device without
// dispatching to it (torch.sparse_csr_tensor(..., device="flagos"),
// cpu_csr.to("flagos")). Operators run the native device's kernels for the
// layout (SparseCsrCPU, SparseCsrCUDA; layout_routing_kernel,
// run_native_layout) on a twin: a tensor of the same layout and sizes on the
// native device over the native views of the three components. A result of
// such a layout comes back the same way (NativeViews::layout_to_flagos).
// PyTorch's device-independent accessors below hand out the components
// themselves; its empty_like makes the result on the device asked for.

#include <ATen/SparseCsrTensorImpl.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_compressed_tensor_unsafe_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <torch/library.h>

#include "aten/fallback.h"
#include "aten/native_view.h"

namespace torch_fl::aten {
namespace {

// The impl's own members: the operators (crow_indices(), values()) would
// dispatch a flagos tensor back here.
const at::SparseCsrTensorImpl& compressed_impl(const at::Tensor& t) {
  return *static_cast<const at::SparseCsrTensorImpl*>(t.unsafeGetTensorImpl());
}

// A tensor of `like`'s layout and sizes over the given components, on their
// device. No checks: the components are those of a valid tensor.
at::Tensor compressed_like(const at::Tensor& like, const at::Tensor& compressed,
                           const at::Tensor& plain, const at::Tensor& values) {
  return at::native::_sparse_compressed_tensor_unsafe_symint(
      compressed, plain, values, like.sym_sizes(), like.scalar_type(), like.layout(),
      values.device());
}

}  // namespace

at::Tensor NativeViews::compressed_view_of(const at::Tensor& flagos) {
  // The components are the flagos tensor's own, alive for the call.
  const at::SparseCsrTensorImpl& impl = compressed_impl(flagos);
  const at::Tensor compressed = view_of(impl.compressed_indices());
  const at::Tensor plain = view_of(impl.plain_indices());
  return compressed_like(flagos, compressed, plain, view_of(impl.values()));
}

at::Tensor NativeViews::compressed_to_flagos(const at::Tensor& native, c10::DeviceIndex device) {
  const at::SparseCsrTensorImpl& impl = compressed_impl(native);
  const at::Tensor compressed = to_flagos(impl.compressed_indices(), device);
  const at::Tensor plain = to_flagos(impl.plain_indices(), device);
  return compressed_like(native, compressed, plain, to_flagos(impl.values(), device));
}

void NativeViews::compressed_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin,
                                       c10::DeviceIndex device) {
  auto* impl = static_cast<at::SparseCsrTensorImpl*>(flagos);
  const at::SparseCsrTensorImpl& native = compressed_impl(twin);
  at::Tensor compressed =
      component_to_flagos(native.compressed_indices(), impl->compressed_indices(), device);
  at::Tensor plain = component_to_flagos(native.plain_indices(), impl->plain_indices(), device);
  at::Tensor values = component_to_flagos(native.values(), impl->values(), device);
  impl->set_member_tensors(compressed, plain, values, native.sizes());
}

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  // Device-independent too, making the result where the options say
  // (empty_like(t, device="cpu")), as sparse_tensors.cpp's COO one.
  m.impl("empty_like", TORCH_FN(at::native::empty_like_sparse_csr));
  // Component by component, across devices too (a copy from the CPU).
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_routing_kernel>());
}

}  // namespace torch_fl::aten
