#include "runtime/result_tensor.h"

#include <c10/core/InferenceMode.h>

namespace torch_fl::runtime {
namespace {

// Keys of a tensor of `backend` as TensorImpl's constructor sets them outside
// inference mode, and inside it (made at load: read on every routed call).
c10::DispatchKeySet keys_of(c10::DispatchKey backend) {
  const auto component = c10::toBackendComponent(backend);
  return c10::DispatchKeySet(backend) | c10::getAutocastRelatedKeySetFromBackend(component) |
         c10::getAutogradRelatedKeySetFromBackend(component);
}
c10::DispatchKeySet inference_keys_of(c10::DispatchKey backend) {
  return keys_of(backend) - c10::autograd_dispatch_keyset_with_ADInplaceOrView;
}
const c10::DispatchKeySet kKeys = keys_of(c10::DispatchKey::PrivateUse1);
const c10::DispatchKeySet kInferenceKeys = inference_keys_of(c10::DispatchKey::PrivateUse1);
const c10::DispatchKeySet kConjNegKeys({c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});

}  // namespace

// The base is made as an inference tensor (keys without autograd), so that it
// allocates no version counter; the keys then come from the derived class.
// Members are reached through this class: they are TensorImpl's protected
// ones. Inlined into both derived constructors: one of them runs per routed
// result or view.
C10_ALWAYS_INLINE CopiedTensorImpl::CopiedTensorImpl(c10::Storage storage, c10::DispatchKeySet keys,
                                   const c10::TensorImpl& from)
    : c10::TensorImpl(c10::TensorImpl::VIEW, std::move(storage), kInferenceKeys, from.dtype()) {
  key_set_ = keys;
  sizes_and_strides_ = from.*(&CopiedTensorImpl::sizes_and_strides_);
  storage_offset_ = from.storage_offset();
  numel_ = from.numel();
  // The contiguity flags as `from` has them, not recomputed: they are
  // functions of the sizes and strides just copied.
  const auto contiguous = &CopiedTensorImpl::is_contiguous_default;
  is_contiguous_ = (from.*contiguous)(c10::MemoryFormat::Contiguous);
  is_channels_last_contiguous_ = (from.*contiguous)(c10::MemoryFormat::ChannelsLast);
  is_channels_last_3d_contiguous_ = (from.*contiguous)(c10::MemoryFormat::ChannelsLast3d);
  const auto strides_like = &CopiedTensorImpl::is_strides_like_default;
  is_channels_last_ = (from.*strides_like)(c10::MemoryFormat::ChannelsLast);
  is_channels_last_3d_ = (from.*strides_like)(c10::MemoryFormat::ChannelsLast3d);
  is_non_overlapping_and_dense_ =
      (from.*(&CopiedTensorImpl::is_non_overlapping_and_dense_default))();
}

ResultTensorImpl::ResultTensorImpl(c10::Storage storage, c10::TensorImpl& native)
    : CopiedTensorImpl(std::move(storage),
                       (native.is_inference() ? kInferenceKeys : kKeys) |
                           (native.key_set() & kConjNegKeys),
                       native) {
  if (!native.is_inference()) version_counter_ = native.version_counter();
}

NativeViewImpl::NativeViewImpl(c10::Storage twin, c10::DispatchKey native_key,
                               c10::TensorImpl& flagos)
    : CopiedTensorImpl(std::move(twin), kInferenceKeys, flagos) {
  static const c10::DispatchKeySet keys = keys_of(native_key);
  static const c10::DispatchKeySet inference_keys = inference_keys_of(native_key);
  const bool inference_mode = c10::InferenceMode::is_enabled();
  key_set_ = (inference_mode ? inference_keys : keys) | (flagos.key_set() & kConjNegKeys);
  if (!inference_mode) {
    version_counter_ = flagos.is_inference() ? c10::VariableVersion(/*version=*/0)
                                             : flagos.version_counter();
  }
}

}  // namespace torch_fl::runtime
