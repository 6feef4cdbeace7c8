#pragma once

// Zero-copy "native views": a tensor of the driver's native device type (CPU
// on the host driver) over the same memory as a flagos tensor, and the way
// back. A native view never changes the flagos tensor or its storage: it gets
// a StorageImpl of its own that points at the same bytes.
//
// One NativeViews object serves one kernel call: flagos tensors that share a
// storage get native views that share one native storage, so aliasing between
// arguments survives the trip, and results are mapped back by storage.

#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include "aten/pointer_index.h"

namespace torch_fl::aten {

class ViewCache;  // native_view.cpp

class NativeViews {
 public:
  // `reuse_views`: take native views from, and give results to, the calling
  // thread's view cache (below). Only for native kernels: a view handed to
  // Python gains a Python object, which a cache must not keep.
  explicit NativeViews(bool reuse_views = false) noexcept;

  // The device type native views are made of (kCPU for the host driver),
  // its dispatch key, and the native device of flagos device `index` (the
  // CPU has no index).
  static c10::DeviceType native_type();
  static c10::DispatchKey native_key();
  static c10::Device native_device(c10::DeviceIndex index);
  // The native device's key for the layout of flagos key `flagos` (a
  // per-backend key: NestedTensorPrivateUse1 -> NestedTensorCPU/CUDA,
  // SparsePrivateUse1 -> SparseCPU/CUDA, SparseCsrPrivateUse1 ->
  // SparseCsrCPU/CUDA).
  static c10::DispatchKey native_key_like(c10::DispatchKey flagos);

  // Room for `n` more views: a list argument's elements, without regrowing.
  void reserve(size_t n) { tensors_.reserve(tensors_.size() + n); }

  // A native view of a flagos tensor (undefined stays undefined). `flagos`
  // must outlive this object: only its address is kept, because copying a
  // tensor that Python owns costs a Python reference count under the GIL.
  at::Tensor to_native(const at::Tensor& flagos) { return view_of(flagos); }

  // The same view as this object holds it (or `flagos` itself, undefined),
  // without a reference count of the caller's own: for a caller that borrows
  // it at once (c10::MaybeOwned), since the reference is valid only until the
  // next view is made (the list holding the views may grow). The view itself
  // lives as long as this object.
  const at::Tensor& view_of(const at::Tensor& flagos);

  // A flagos tensor for a native result of this call: the flagos argument
  // itself when `native` is one of our views, a flagos tensor on the argument's
  // storage when it aliases one, else the result's memory adopted (or, memory
  // flagos did not allocate, copied) onto flagos device `device`.
  at::Tensor to_flagos(const at::Tensor& native, c10::DeviceIndex device);

  // Whether `t` is nested or sparse (COO or compressed): a tensor of
  // components, which crosses to the native device as a twin (below).
  static bool has_components(const at::Tensor& t) {
    return t.is_nested() || t.is_sparse() || t.unsafeGetTensorImpl()->is_sparse_compressed();
  }

  // A nested or sparse flagos tensor's native twin: a tensor of the same
  // layout on the native device over the native views of its components (a
  // nested tensor's buffer, with the same sizes, strides and offsets; a
  // sparse COO tensor's indices and values, with its sizes and coalesced
  // flag; a sparse compressed one's compressed and plain indices and values,
  // with its sizes). `buffers` keeps components made for the call alive (only
  // their addresses are kept). Defined in nested_tensors.cpp,
  // sparse_tensors.cpp and sparse_compressed.cpp.
  at::Tensor layout_view_of(const at::Tensor& flagos, std::vector<at::Tensor>& buffers);
  // to_flagos of a nested or sparse result: its components mapped as any
  // result (adopted, or on an argument's storage), put together the same way.
  at::Tensor layout_to_flagos(const at::Tensor& native, c10::DeviceIndex device);

  // After a kernel ran: carries changes a kernel made to the native view of a
  // mutable argument (resize, restride, a grown storage) to the flagos tensor.
  void sync_back(c10::TensorImpl* flagos, const at::Tensor& native_view);
  // The same for the twin of a written nested or sparse argument: a sparse
  // kernel gives its output new components, sizes and flags (add_, zero_,
  // copy_, sparse_resize_and_clear_), which the flagos tensor takes over.
  void layout_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin, c10::DeviceIndex device);

 private:
  at::Tensor nested_view_of(const at::Tensor& flagos, std::vector<at::Tensor>& buffers);
  at::Tensor nested_to_flagos(const at::Tensor& native, c10::DeviceIndex device);
  at::Tensor sparse_view_of(const at::Tensor& flagos);
  at::Tensor sparse_to_flagos(const at::Tensor& native, c10::DeviceIndex device);
  at::Tensor compressed_view_of(const at::Tensor& flagos);
  at::Tensor compressed_to_flagos(const at::Tensor& native, c10::DeviceIndex device);
  void sparse_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin, c10::DeviceIndex device);
  void compressed_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin,
                            c10::DeviceIndex device);
  // to_flagos of a twin's component after a kernel ran: `flagos`, the flagos
  // tensor's own component, when the twin still holds its view (with what
  // the kernel changed in that view carried over), else the component mapped
  // as any result.
  at::Tensor component_to_flagos(const at::Tensor& native, const at::Tensor& flagos,
                                 c10::DeviceIndex device);

  struct TensorPair {
    // Owned for the call: results are matched to views by TensorImpl address,
    // which a view freed mid-call (a temporary argument) would hand on to a
    // new result.
    at::Tensor native;
    c10::TensorImpl* flagos;  // kept alive by the caller (see to_native)
    // The view's storage as made: the flagos storage's twin, or owned_'s (a
    // kernel may swap the view's own storage pointer).
    c10::StorageImpl* native_storage;
  };
  // A native storage made for this call alone: the flagos storage has no
  // valid twin (memory replaced behind its back, a storage PyTorch made).
  struct OwnedStorage {
    c10::StorageImpl* flagos;
    c10::Storage native;
  };
  using Adopted = std::pair<c10::StorageImpl*, c10::Storage>;  // (native, flagos)
  // The keys the lists are indexed by.
  static constexpr auto tensor_by_native = [](const TensorPair& t) -> const void* {
    return t.native.unsafeGetTensorImpl();
  };
  static constexpr auto tensor_by_native_storage = [](const TensorPair& t) -> const void* {
    return t.native_storage;
  };
  static constexpr auto owned_by_flagos = [](const OwnedStorage& o) -> const void* {
    return o.flagos;
  };
  static constexpr auto owned_by_native = [](const OwnedStorage& o) -> const void* {
    return o.native.unsafeGetStorageImpl();
  };
  static constexpr auto adopted_by_native = [](const Adopted& a) -> const void* {
    return a.first;
  };

  ViewCache* cache_;  // the calling thread's, when reusing views; else null
  c10::SmallVector<TensorPair, 4> tensors_;
  // In tensors_: by native TensorImpl, and by native storage (a twin belongs
  // to one flagos storage, so the first view over it names that storage).
  PointerIndex tensor_of_native_, tensor_of_native_storage_;
  c10::SmallVector<OwnedStorage, 1> owned_;
  PointerIndex owned_of_flagos_, owned_of_native_;  // in owned_
  // Native storages of results already mapped to a flagos storage.
  c10::SmallVector<Adopted, 2> adopted_;
  PointerIndex adopted_of_native_;
};

// A flagos tensor over `storage` with the geometry (sizes, strides, offset,
// conj/neg/zero bits) of `like`.
at::Tensor flagos_tensor_on(c10::Storage storage, const at::Tensor& like);
// The same for a native tensor (a view of flagos memory for a native kernel).
at::Tensor native_tensor_on(c10::Storage storage, const at::Tensor& like);

// A DataPtr deleter that drops one reference to the StorageImpl in `ctx`: a
// native storage over flagos memory keeps the flagos storage alive with it.
void release_storage_ref(void* ctx);

// A native storage (not resizable) over all of flagos storage `flagos`'s
// bytes, on the native device of flagos device `index`, that keeps `flagos`
// alive: for memory handed beyond one call (collectives, other processes).
c10::Storage native_storage_holding(c10::StorageImpl* flagos, c10::DeviceIndex index);

// A flagos storage on flagos `device` over all of `native`'s bytes that keeps
// `native` alive and frees through it.
c10::Storage flagos_storage_holding(c10::StorageImpl* native, c10::DeviceIndex device);

}  // namespace torch_fl::aten
