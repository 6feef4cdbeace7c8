#pragma once

// The two TensorImpls every routed operator makes, made the cheap way: each
// copies another TensorImpl's metadata as it is (sizes, strides, offset,
// numel and the contiguity flags: no recomputed strides or contiguity), and
// takes its memory from a per-thread cache.
//
//  - ResultTensorImpl: the flagos tensor for a native kernel's fresh result
//    (aten/native_view.cpp, NativeViews::to_flagos), copied from the kernel's
//    own TensorImpl. The two share one version counter (no allocation; the
//    kernel's tensor is an alias of the result, so an in-place kernel that
//    bumps its version bumps the result's, as PyTorch's views do). The
//    kernel's TensorImpl can stay with the result as its native view
//    (keep_native_view): the next operator that takes the result (usually the
//    very next one) finds the view there, next to the TensorImpl the
//    dispatcher just read, with no lookup in the thread's view cache, and the
//    view dies with the result instead of waiting to be evicted.
//  - NativeViewImpl: a native view of a flagos tensor that has none yet (a
//    weight's transpose, a reshape), copied from the flagos TensorImpl.

#include <typeinfo>

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

#include "runtime/thread_cache.h"

namespace torch_fl::runtime {

// The keys a TensorImpl keeps its flags in: the conj and neg bits, and an
// efficient zero tensor's (forward AD's zero tangents: no memory, the key
// sends every operator to PyTorch's zero-tensor kernels). Every tensor made
// from another (a result, a native view, a flagos tensor on a storage) takes
// them over, and a kept view must agree on them.
inline constexpr c10::DispatchKeySet kFlagKeys =
    c10::DispatchKeySet(c10::DispatchKey::Conjugate) |
    c10::DispatchKeySet(c10::DispatchKey::Negative) |
    c10::DispatchKeySet(c10::DispatchKey::ZeroTensor);

class CopiedTensorImpl : public c10::TensorImpl {
 public:
  // Whether `t`'s geometry can be copied: concrete, and kept where TensorImpl
  // keeps it by default (not a subclass's custom sizes or strides).
  static bool copyable(const c10::TensorImpl& t) noexcept {
    return !t.has_symbolic_sizes_strides() &&
           !(t.*(&CopiedTensorImpl::matches_policy))(SizesStridesPolicy::CustomStrides);
  }

 protected:
  // A TensorImpl over `storage` with `keys`, and `from`'s dtype and geometry.
  // It has no version counter: the derived class decides.
  CopiedTensorImpl(c10::Storage storage, c10::DispatchKeySet keys, const c10::TensorImpl& from);
};

class ResultTensorImpl final : public CopiedTensorImpl {
 public:
  // A flagos tensor over `storage` (a flagos storage over `native`'s bytes)
  // with `native`'s sizes, strides, offset, dtype, conj/neg/zero bits, inference
  // state and version counter.
  ResultTensorImpl(c10::Storage storage, c10::TensorImpl& native);

  // Keeps `native`, the kernel's own tensor over this result's twin, as the
  // result's native view. Only before the result is handed out: the view is
  // never replaced, so threads that share the result read it without a lock.
  // Only for native kernels' results: a tensor a Python kernel made has a
  // Python object, which this would keep alive.
  void keep_native_view(at::Tensor native) noexcept { native_view_ = std::move(native); }

  // The native view `impl` keeps, or nullptr when `impl` is no result or keeps
  // none. The caller checks that the view still describes `impl`: metadata
  // operators (resize_, set_, as_strided_) may have changed the result since.
  static const at::Tensor* native_view_of(const c10::TensorImpl* impl) noexcept {
    // An address compare: this class is defined in this library alone, so its
    // type_info is unique, and a mismatch (a weight's TensorImpl) costs no
    // name compare.
    if (&typeid(*impl) != &typeid(ResultTensorImpl)) return nullptr;
    const at::Tensor& view = static_cast<const ResultTensorImpl*>(impl)->native_view_;
    return view.defined() ? &view : nullptr;
  }

  // A tensor that dies while weak references remain gives its view back now.
  void release_resources() override {
    native_view_.reset();
    c10::TensorImpl::release_resources();
  }

  // One is made and freed per routed result: memory from a per-thread cache.
  static void* operator new(size_t n) { return ThreadCache<ResultTensorImpl>::allocate(n); }
  static void operator delete(void* p, size_t n) noexcept {
    ThreadCache<ResultTensorImpl>::release(p, n);
  }

 private:
  at::Tensor native_view_;
};

class NativeViewImpl final : public CopiedTensorImpl {
 public:
  // A tensor of the dispatch key `native_key` over `twin` (a native storage
  // over `flagos`'s bytes) with `flagos`'s dtype, geometry and conj/neg/zero bits.
  // Its keys are those a TensorImpl of `native_key` gets in the current
  // inference mode; outside inference mode it shares `flagos`'s version
  // counter where `flagos` has one (the two alias), else gets its own.
  NativeViewImpl(c10::Storage twin, c10::DispatchKey native_key, c10::TensorImpl& flagos);

  // One is made and freed for most view arguments: memory from a per-thread
  // cache.
  static void* operator new(size_t n) { return ThreadCache<NativeViewImpl>::allocate(n); }
  static void operator delete(void* p, size_t n) noexcept {
    ThreadCache<NativeViewImpl>::release(p, n);
  }
};

}  // namespace torch_fl::runtime
