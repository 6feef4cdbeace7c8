// Sparse compressed tensors (CSR, CSC, BSR, BSC) on flagos: their structure
// accessors, so that their data can come back.
//
// PyTorch builds such a tensor for any device without dispatching to it
// (torch.sparse_csr_tensor(..., device="flagos"), cpu_csr.to("flagos")), so
// flagos cannot refuse one where it is made. Every operator that needs a
// kernel of the layout's own is refused (strided_only.cpp), but the accessors
// are PyTorch's device-independent ones:
// they hand out the dense component tensors, which are ordinary flagos
// tensors. With them `.cpu()` (a composite copy, component by component),
// `.values()`, `.crow_indices()` and the like work, as on CUDA.

#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/values_native.h>
#include <torch/library.h>

namespace torch_fl::aten {

TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
}

}  // namespace torch_fl::aten
