#include "runtime/result_tensor.h"

namespace torch_fl::runtime {
namespace {

// Keys of a flagos tensor as TensorImpl's constructor sets them, outside and
// inside inference mode (made at load: read on every routed call).
const c10::DispatchKeySet kKeys =
    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) |
    c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::PrivateUse1Bit) |
    c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::PrivateUse1Bit);
const c10::DispatchKeySet kInferenceKeys =
    kKeys - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
const c10::DispatchKeySet kConjNegKeys({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});

}  // namespace

// The base is made as an inference tensor (keys without autograd), so that it
// allocates no version counter; the keys, geometry and counter then come from
// the native tensor. Members are reached through this class: they are
// TensorImpl's protected ones.
ResultTensorImpl::ResultTensorImpl(c10::Storage storage, c10::TensorImpl& native)
    : c10::TensorImpl(c10::TensorImpl::VIEW, std::move(storage), kInferenceKeys,
                      native.dtype()) {
  const bool inference = native.is_inference();
  key_set_ = (inference ? kInferenceKeys : kKeys) | (native.key_set() & kConjNegKeys);
  if (!inference) version_counter_ = native.version_counter();
  sizes_and_strides_ = native.*(&ResultTensorImpl::sizes_and_strides_);
  storage_offset_ = native.storage_offset();
  numel_ = native.numel();
  // The contiguity flags as the kernel's tensor has them, not recomputed:
  // they are functions of the sizes and strides just copied.
  const auto contiguous = &ResultTensorImpl::is_contiguous_default;
  is_contiguous_ = (native.*contiguous)(c10::MemoryFormat::Contiguous);
  is_channels_last_contiguous_ = (native.*contiguous)(c10::MemoryFormat::ChannelsLast);
  is_channels_last_3d_contiguous_ = (native.*contiguous)(c10::MemoryFormat::ChannelsLast3d);
  const auto strides_like = &ResultTensorImpl::is_strides_like_default;
  is_channels_last_ = (native.*strides_like)(c10::MemoryFormat::ChannelsLast);
  is_channels_last_3d_ = (native.*strides_like)(c10::MemoryFormat::ChannelsLast3d);
  is_non_overlapping_and_dense_ =
      (native.*(&ResultTensorImpl::is_non_overlapping_and_dense_default))();
}

}  // namespace torch_fl::runtime
