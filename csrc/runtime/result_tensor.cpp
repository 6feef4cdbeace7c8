#include "runtime/result_tensor.h"

#include <c10/core/InferenceMode.h>

namespace torch_fl::runtime {
namespace {

// Keys of a tensor of a backend as TensorImpl's constructor sets them outside
// inference mode, and inside it (made at load: one of them is read per
// routed result or new view).
struct Keys {
  explicit Keys(c10::DispatchKey backend)
      : outside(c10::DispatchKeySet(backend) |
                c10::getAutocastRelatedKeySetFromBackend(c10::toBackendComponent(backend)) |
                c10::getAutogradRelatedKeySetFromBackend(c10::toBackendComponent(backend))),
        inside(outside - c10::autograd_dispatch_keyset_with_ADInplaceOrView) {}
  c10::DispatchKeySet of(bool inference) const { return inference ? inside : outside; }
  const c10::DispatchKeySet outside, inside;
};
const Keys kFlagosKeys(c10::DispatchKey::PrivateUse1);
const Keys kCpuKeys(c10::DispatchKey::CPU);
const Keys kCudaKeys(c10::DispatchKey::CUDA);

// The keys of a native view: the native device is the CPU or CUDA.
c10::DispatchKeySet native_view_keys(c10::DispatchKey native_key, const c10::TensorImpl& flagos) {
  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(native_key == c10::DispatchKey::CPU ||
                                   native_key == c10::DispatchKey::CUDA);
  const Keys& keys = native_key == c10::DispatchKey::CPU ? kCpuKeys : kCudaKeys;
  return keys.of(c10::InferenceMode::is_enabled()) | (flagos.key_set() & kFlagKeys);
}

}  // namespace

// The base is made as an inference tensor (keys without autograd), so that it
// allocates no version counter; then it takes `keys`, and the derived class
// gives it a counter where those keys are not an inference tensor's.
// Members are reached through this class: they are TensorImpl's protected
// ones. Inlined into both derived constructors: one of them runs per routed
// result or view.
C10_ALWAYS_INLINE CopiedTensorImpl::CopiedTensorImpl(c10::Storage storage,
                                                     c10::DispatchKeySet keys,
                                                     const c10::TensorImpl& from)
    : c10::TensorImpl(c10::TensorImpl::VIEW, std::move(storage), kFlagosKeys.inside,
                      from.dtype()) {
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
                       kFlagosKeys.of(native.is_inference()) | (native.key_set() & kFlagKeys),
                       native) {
  if (!is_inference()) version_counter_ = native.version_counter();
}

NativeViewImpl::NativeViewImpl(c10::Storage twin, c10::DispatchKey native_key,
                               c10::TensorImpl& flagos)
    : CopiedTensorImpl(std::move(twin), native_view_keys(native_key, flagos), flagos) {
  if (!is_inference()) {
    version_counter_ =
        flagos.is_inference() ? c10::VariableVersion(/*version=*/0) : flagos.version_counter();
  }
}

}  // namespace torch_fl::runtime
