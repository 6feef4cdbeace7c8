// Call: argument access and allocation for family planners. Outputs are flagos
// tensors made without a dispatch (runtime/flagos_tensor.h), as torch_fl's own
// empty makes them.

#include <cstring>

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <c10/core/TensorImpl.h>

#include "flaggems/cuda_launch.h"
#include "flaggems/plan.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/flagos_tensor.h"

namespace torch_fl::flaggems {

abi::TType elem_type(c10::ScalarType t) noexcept {
  using abi::TType;
  switch (t) {
    case c10::kFloat:
      return TType::kFp32;
    case c10::kHalf:
      return TType::kFp16;
    case c10::kBFloat16:
      return TType::kBf16;
    case c10::kDouble:
      return TType::kFp64;
    case c10::kLong:
      return TType::kI64;
    case c10::kInt:
      return TType::kI32;
    case c10::kShort:
      return TType::kI16;
    case c10::kChar:
      return TType::kI8;
    case c10::kByte:
      return TType::kU8;
    case c10::kBool:
      return TType::kU1;
    default:
      return TType::kInvalid;
  }
}

const at::Tensor* Call::tensor_value(const c10::IValue& v) noexcept {
  if (!v.isTensor()) return nullptr;
  const at::Tensor& t = v.toTensor();
  if (!t.defined() || t.device().type() != runtime::kFlagos) return nullptr;
  const c10::DeviceIndex d = t.device().index();
  if (device_ == -1) {
    device_ = d;
  } else if (device_ != d) {
    return nullptr;  // mixed devices: the Python path raises the usual error
  }
  return &t;
}

const TunedConfig* Call::tuned(TunerSlot& tuner, const int64_t* key, int n, CallPlan& plan) const {
  if (const TunedConfig* c = tuner.table.find(key, n)) return c;
  plan.need_tuner = &tuner;
  plan.tuner_key_len = n;
  for (int i = 0; i < n; ++i) plan.tuner_key[i] = key[i];
  return nullptr;
}

at::Tensor Call::empty(c10::IntArrayRef sizes, c10::ScalarType dtype) const {
  return runtime::empty_flagos(device_, sizes, std::nullopt, dtype);
}

at::Tensor Call::empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                               c10::ScalarType dtype) const {
  return runtime::empty_flagos(device_, sizes, strides, dtype);
}

at::Tensor Call::empty_like(const at::Tensor& t, c10::ScalarType dtype) const {
  // torch.empty_like's preserve_format rule.
  if (t.is_non_overlapping_and_dense()) return empty_strided(t.sizes(), t.strides(), dtype);
  auto strides = at::infer_dense_strides(t.sizes(), t.strides());
  return empty_strided(t.sizes(), strides, dtype);
}

at::Tensor Call::contiguous(const at::Tensor& t, CallPlan& plan) const {
  if (t.is_contiguous()) return t;
  at::Tensor out = empty(t.sizes(), t.scalar_type());
  out.copy_(t);  // flagos' own copy (native), as .contiguous() on CUDA
  plan.keep.push_back(out);
  return out;
}

at::Tensor Call::zeros(c10::IntArrayRef sizes, c10::ScalarType dtype) const {
  at::Tensor out = empty(sizes, dtype);
  if (runtime::uses_cuda()) {
    cuda::memset_zero(device_, out.data_ptr(), out.nbytes());
  } else {
    std::memset(out.data_ptr(), 0, out.nbytes());  // host driver (offline planning)
  }
  return out;
}

void post_copy(CallPlan& plan) { plan.post_dst.copy_(plan.post_src); }

at::Tensor view_of(const at::Tensor& base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t storage_offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW,
                                                     c10::Storage(base.storage()),
                                                     base.key_set(), base.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, storage_offset);
  return t;
}

at::Tensor permuted(const at::Tensor& t, const int64_t* order) {
  c10::SmallVector<int64_t, 6> sizes, strides;
  for (int64_t i = 0; i < t.dim(); ++i) {
    sizes.push_back(t.size(order[i]));
    strides.push_back(t.stride(order[i]));
  }
  return view_of(t, sizes, strides, t.storage_offset());
}

at::Tensor dim_last(const at::Tensor& t, int64_t dim) {
  c10::SmallVector<int64_t, 6> order;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i != dim) order.push_back(i);
  }
  order.push_back(dim);
  return permuted(t, order.data());
}

}  // namespace torch_fl::flaggems
