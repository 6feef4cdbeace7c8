#pragma once

// The flagos tensor for a native kernel's fresh result (aten/native_view.cpp,
// NativeViews::to_flagos): the kernel's own TensorImpl stays behind as the
// result's cached native view, and this one is made beside it.
//
// Made the cheap way, because every routed operator makes one: the kernel's
// TensorImpl already holds everything a flagos TensorImpl needs but its
// storage and device, so its metadata is copied as it is (no recomputed
// strides or contiguity), and the two share one version counter (no
// allocation; the view is an alias of the result, so an in-place kernel that
// bumps the view's version bumps the result's, as PyTorch's views do).

#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include "runtime/thread_cache.h"

namespace torch_fl::runtime {

class ResultTensorImpl final : public c10::TensorImpl {
 public:
  // A flagos tensor over `storage` (a flagos storage over `native`'s bytes)
  // with `native`'s sizes, strides, offset, dtype, conj/neg bits, inference
  // state and version counter.
  ResultTensorImpl(c10::Storage storage, c10::TensorImpl& native);

  // One is made and freed per routed result: memory from a per-thread cache.
  static void* operator new(size_t n) { return ThreadCache<ResultTensorImpl>::allocate(n); }
  static void operator delete(void* p, size_t n) noexcept {
    ThreadCache<ResultTensorImpl>::release(p, n);
  }
};

}  // namespace torch_fl::runtime
