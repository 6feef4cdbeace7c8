// Sparse COO tensors (torch.sparse_coo_tensor, nn.Embedding(sparse=True)'s
// gradients, SparseAdam) on flagos.
//
// A sparse flagos tensor is PyTorch's SparseTensorImpl whose indices and values
// are flagos tensors (SparsePrivateUse1). Operators run the native device's
// sparse kernels (SparseCPU, SparseCUDA; layout_routing_kernel,
// run_native_layout) on a twin: a sparse tensor of the native device over the
// native views of the indices and values, with the same sizes, sparse and dense
// dims and coalesced flag. A sparse result comes back the same way: its
// indices and values mapped as any result (adopted, or the arguments' own),
// put together with its sizes and flag. So `cpu_sparse.to("flagos")`, the
// factories, the accessors (_indices, _values, _nnz) and arithmetic are the
// native device's own kernels.

#include <ATen/SparseTensorImpl.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/empty_like_native.h>
#include <torch/library.h>

#include "aten/fallback.h"
#include "aten/native_view.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

// The impl's own accessors: the operators (sparse_dim(), _indices()) would
// dispatch a flagos tensor back here.
const at::SparseTensorImpl& sparse_impl(const at::Tensor& t) {
  return *static_cast<const at::SparseTensorImpl*>(t.unsafeGetTensorImpl());
}

// A sparse tensor over `indices` and `values` on their device, shaped as `like`.
at::Tensor sparse_like(const at::SparseTensorImpl& like, const at::Tensor& indices,
                       const at::Tensor& values) {
  // The constructor makes its placeholder components on the current device
  // and checks the given ones against it.
  const c10::DeviceGuard guard(values.device());
  return at::native::new_with_dims_and_tensor_sparse_symint(
      like.sparse_dim(), like.dense_dim(), like.sym_sizes(), indices, values,
      like.dtype().toScalarType(), c10::kSparse, values.device(), /*pin_memory=*/std::nullopt,
      like.coalesced());
}

}  // namespace

at::Tensor NativeViews::sparse_view_of(const at::Tensor& flagos) {
  // The components are the flagos tensor's own, alive for the call.
  const at::SparseTensorImpl& sparse = sparse_impl(flagos);
  const at::Tensor indices = view_of(sparse.indices());
  return sparse_like(sparse, indices, view_of(sparse.values()));
}

at::Tensor NativeViews::sparse_to_flagos(const at::Tensor& native, c10::DeviceIndex device) {
  const at::SparseTensorImpl& sparse = sparse_impl(native);
  const at::Tensor indices = to_flagos(sparse.indices(), device);
  return sparse_like(sparse, indices, to_flagos(sparse.values(), device));
}

void NativeViews::sparse_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin,
                                   c10::DeviceIndex device) {
  auto* impl = static_cast<at::SparseTensorImpl*>(flagos);
  const at::SparseTensorImpl& native = sparse_impl(twin);
  at::Tensor indices = component_to_flagos(native.indices(), impl->indices(), device);
  at::Tensor values = component_to_flagos(native.values(), impl->values(), device);
  impl->raw_resize_(native.sparse_dim(), native.dense_dim(), native.sizes());
  impl->set_indices_and_values_unsafe(indices, values);
  impl->set_coalesced(native.coalesced());
}

// PyTorch's device-independent kernels. empty_like reads the sizes and dims
// alone and makes the result where the options say (empty_like(t,
// device="cpu") and the *_like family), which the native kernel on a twin
// would put on flagos.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  m.impl("empty_like", TORCH_FN(at::native::empty_like_sparse_coo));
  // Device-independent as well (indices and values moved with .to()): a copy
  // between a sparse flagos tensor and one of another device (DDP's sparse
  // gradients), which a twin of each could not take.
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&layout_routing_kernel>());
}

}  // namespace torch_fl::aten
