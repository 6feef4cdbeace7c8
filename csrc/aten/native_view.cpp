#include "aten/native_view.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <array>
#include <typeinfo>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/result_tensor.h"
#include "runtime/storage.h"

namespace torch_fl::aten {
namespace {

using runtime::FlagosStorage;
using runtime::kFlagos;

void copy_geometry(c10::TensorImpl* dst, const at::Tensor& src) {
  dst->set_sizes_and_strides(src.sizes(), src.strides(), src.storage_offset());
  if (src.is_conj()) dst->_set_conj(true);
  if (src.is_neg()) dst->_set_neg(true);
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key,
                     const at::Tensor& like) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  copy_geometry(impl.get(), like);
  return at::Tensor(std::move(impl));
}

}  // namespace

void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// The calling thread's recent native views, so that a tensor used again (a
// weight, the result of the previous operator) does not get a new TensorImpl
// per call: building one is the largest remaining cost of a small operator.
// Direct-mapped by the flagos TensorImpl's address. An entry is used only if
// it still describes the flagos tensor exactly: the same twin storage (a twin
// is never shared by two live flagos storages, and the entry keeps it alive,
// so its address cannot be reused), dtype, sizes, strides, offset and
// conj/neg bits. A stale entry is therefore harmless; it holds one small
// TensorImpl and a twin that owns no memory.
class ViewCache {
 public:
  const at::Tensor* find(const c10::TensorImpl* flagos, const c10::StorageImpl* twin) const {
    const Entry& e = entries_[slot(flagos)];
    if (e.flagos != flagos || !e.native.defined()) return nullptr;
    const c10::TensorImpl* n = e.native.unsafeGetTensorImpl();
    if (n->unsafe_storage().unsafeGetStorageImpl() != twin || n->dtype() != flagos->dtype() ||
        n->storage_offset() != flagos->storage_offset() || n->is_conj() != flagos->is_conj() ||
        n->is_neg() != flagos->is_neg() || n->sizes() != flagos->sizes() ||
        n->strides() != flagos->strides()) {
      return nullptr;
    }
    return &e.native;
  }

  void put(const c10::TensorImpl* flagos, const at::Tensor& native) {
    Entry& e = entries_[slot(flagos)];
    e.flagos = flagos;
    e.native = native;
  }

 private:
  // Enough for an optimizer's `_foreach_*` lists over every parameter (a few
  // thousand tensors) to stay cached between steps: 64 KiB a thread.
  static constexpr int kSlotBits = 12;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;
  static size_t slot(const void* p) {  // Fibonacci hashing of the address
    return (reinterpret_cast<uintptr_t>(p) * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits);
  }
  struct Entry {
    const c10::TensorImpl* flagos = nullptr;
    at::Tensor native;
  };
  std::array<Entry, kSlots> entries_;
};

namespace {
ViewCache* thread_view_cache() {
  thread_local ViewCache cache;
  return &cache;
}
}  // namespace

NativeViews::NativeViews(bool reuse_views) noexcept
    : cache_(reuse_views ? thread_view_cache() : nullptr) {}

// Decided by the driver, which is selected once per process before any
// tensor exists; read on every view, so computed once.
c10::DispatchKey NativeViews::native_key() {
  static const c10::DispatchKey key =
      runtime::driver().nativeDevice() == hal::NativeDevice::kHost ? c10::DispatchKey::CPU
                                                                    : c10::DispatchKey::CUDA;
  return key;
}

c10::DeviceType NativeViews::native_type() {
  static const c10::DeviceType type = native_key() == c10::DispatchKey::CPU
                                          ? c10::DeviceType::CPU
                                          : c10::DeviceType::CUDA;
  return type;
}

c10::Device NativeViews::native_device(c10::DeviceIndex index) {
  const c10::DeviceType type = native_type();
  return type == c10::DeviceType::CPU ? c10::Device(type) : c10::Device(type, index);
}

at::Tensor native_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), NativeViews::native_key(), like);
}

at::Tensor flagos_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

at::Tensor NativeViews::to_native(const at::Tensor& flagos) {
  if (!flagos.defined()) return flagos;
  c10::StorageImpl* fs = flagos.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  StoragePair* pair = storage_of_flagos_.find(storages_, fs, storage_by_flagos);
  if (pair == nullptr) {
    // The storage's twin when it has a valid one (every storage flagos made),
    // else a native storage for this call alone.
    if (c10::StorageImpl* twin = FlagosStorage::twin_of(fs)) {
      storages_.push_back({fs, twin, {}, fs->data_ptr().get()});
    } else {
      c10::Storage owned(runtime::make_native_twin(*fs));
      c10::StorageImpl* raw = owned.unsafeGetStorageImpl();
      storages_.push_back({fs, raw, std::move(owned), fs->data_ptr().get()});
    }
    storage_of_flagos_.added(storages_, storage_by_flagos);
    storage_of_native_.added(storages_, storage_by_native);
    pair = &storages_.back();
  }
  // Views of twins outlive the call in the thread's cache, keyed by the flagos
  // tensor; a storage made for this call alone is not cached.
  const bool cacheable = cache_ != nullptr && !pair->owned;
  if (cacheable) {
    if (const at::Tensor* cached = cache_->find(flagos.unsafeGetTensorImpl(), pair->native)) {
      tensors_.push_back({*cached, flagos.unsafeGetTensorImpl()});
      tensor_of_native_.added(tensors_, tensor_by_native);
      return *cached;
    }
  }
  at::Tensor view = tensor_on(
      c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(pair->native)), native_key(),
      flagos);
  tensors_.push_back({view, flagos.unsafeGetTensorImpl()});
  tensor_of_native_.added(tensors_, tensor_by_native);
  if (cacheable) cache_->put(flagos.unsafeGetTensorImpl(), view);
  return view;
}

void NativeViews::sync_back(c10::TensorImpl* flagos, const at::Tensor& native_view) {
  c10::StorageImpl* ns = native_view.storage().unsafeGetStorageImpl();
  c10::StorageImpl* fs = flagos->storage().unsafeGetStorageImpl();
  if (StoragePair* p = storage_of_native_.find(storages_, ns, storage_by_native)) {
    if (ns->data_ptr().get() != p->original_data || ns->nbytes() != fs->nbytes()) {
      // The kernel grew the storage: its new memory came from the flagos
      // allocator (capturing scope), so it moves over without a copy, and the
      // native storage points at it again, owning nothing.
      const size_t nbytes = ns->nbytes();
      c10::DataPtr grown = ns->set_data_ptr(
          c10::DataPtr(p->original_data, ns->data_ptr().device()));
      TORCH_INTERNAL_ASSERT(runtime::FlagosAllocator::owns(grown),
                            "grown storage was not allocated by flagos");
      grown.unsafe_set_device(flagos->device());
      runtime::replace_memory(*fs, std::move(grown), nbytes);
      p->original_data = fs->data_ptr().get();
    }
  }
  if (flagos->sizes() != native_view.sizes() || flagos->strides() != native_view.strides() ||
      flagos->storage_offset() != native_view.storage_offset()) {
    flagos->set_sizes_and_strides(native_view.sizes(), native_view.strides(),
                                  native_view.storage_offset());
  }
}

at::Tensor NativeViews::to_flagos(const at::Tensor& native,
                                  c10::DeviceIndex device) {
  if (!native.defined() || native.device().type() == kFlagos) return native;
  if (TensorPair* t = tensor_of_native_.find(tensors_, native.unsafeGetTensorImpl(), tensor_by_native)) {
    return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(t->flagos));
  }
  c10::StorageImpl* ns = native.storage().unsafeGetStorageImpl();
  if (StoragePair* p = storage_of_native_.find(storages_, ns, storage_by_native)) {
    return flagos_tensor_on(
        c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(p->flagos)), native);
  }
  if (auto* a = adopted_of_native_.find(adopted_, ns, adopted_by_native)) {
    return flagos_tensor_on(a->second, native);
  }
  if (native.device().type() != native_type()) {
    // A result on some third device type (e.g. a CPU scalar from a CUDA op):
    // returned as it is, as the native op would.
    return native;
  }
  // A flagos TensorImpl cannot carry a quantizer: adopting the memory would
  // hand back a tensor of a quantized dtype that is not quantized.
  TORCH_CHECK_NOT_IMPLEMENTED(!native.is_quantized(), "a kernel returned a quantized tensor (",
                              native.scalar_type(), "), but flagos tensors are not quantized. "
                              "Keep quantized tensors on the CPU, or dequantize them "
                              "(.dequantize()) before moving them to flagos.");
  const c10::DataPtr& dp = ns->data_ptr();
  const size_t nbytes = ns->nbytes();
  c10::Storage flagos_storage;
  // Held by this result alone: then nothing else holds its version counter
  // either, so the flagos tensor may share it (ResultTensorImpl).
  const bool sole_owner =
      runtime::FlagosAllocator::owns(dp) && native.storage().use_count() == 1;
  bool native_is_twin = false;  // the result's storage became the twin
  if (sole_owner) {
    // Flagos memory already (the host driver's capturing scope, or the CUDA
    // caching allocator), held by this result alone: the allocation itself
    // moves to a flagos storage, so it frees (and record_stream works)
    // exactly as for any flagos tensor; the result's own storage stays
    // behind as the flagos storage's twin.
    c10::DataPtr moved = ns->set_data_ptr(c10::DataPtr(nullptr, dp.device()));
    moved.unsafe_set_device(c10::Device(kFlagos, device));
    c10::intrusive_ptr<c10::StorageImpl> twin;
    if (runtime::usable_as_twin(*ns)) {
      twin = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(ns);
      native_is_twin = true;
    }
    flagos_storage = c10::Storage(
        runtime::make_flagos_storage(nbytes, std::move(moved), std::move(twin)));
  } else if (dp.get() == nullptr || runtime::FlagosAllocator::owns(dp)) {
    // Flagos memory shared with other native tensors: the flagos storage
    // keeps the native one alive and frees through it.
    c10::raw::intrusive_ptr::incref(ns);
    c10::DataPtr ref(dp.get(), ns, &release_storage_ref, c10::Device(kFlagos, device));
    flagos_storage = c10::Storage(runtime::make_flagos_storage(nbytes, std::move(ref)));
  } else {
    // Memory from elsewhere (a kernel's cached constant, another allocator):
    // copied, so that every flagos storage is flagos memory.
    c10::Storage fresh(runtime::allocate_flagos_storage(device, nbytes));
    if (nbytes > 0) {
      runtime::driver().copy(fresh.mutable_data(), dp.get(), nbytes,
                             hal::CopyKind::kDeviceToDevice, nullptr, false);
    }
    flagos_storage = std::move(fresh);
  }
  adopted_.emplace_back(ns, flagos_storage);
  adopted_of_native_.added(adopted_, adopted_by_native);
  // A sole owner's flagos tensor takes the kernel's metadata as it is
  // (runtime/result_tensor.h); others are made from its geometry.
  at::Tensor result =
      sole_owner ? at::Tensor(c10::make_intrusive<runtime::ResultTensorImpl>(
                       std::move(flagos_storage), *native.unsafeGetTensorImpl()))
                 : flagos_tensor_on(std::move(flagos_storage), native);
  // The kernel's own result, over the twin, is a native view of the new
  // flagos tensor: the next operator that takes this result (usually the
  // very next one) uses it.
  if (cache_ != nullptr && native_is_twin) cache_->put(result.unsafeGetTensorImpl(), native);
  return result;
}

}  // namespace torch_fl::aten
