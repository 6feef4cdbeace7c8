#pragma once

// Flagos storages, and the native twin each one carries.
//
// Operators run native kernels over "native views" of flagos tensors: tensors
// of the driver's native device type (CPU on the host driver, CUDA on the cuda
// driver) over the same bytes. A view needs a StorageImpl of the native type.
// Making one per argument per call was the largest single cost of the routing
// path, so every flagos storage that torch_fl creates is a FlagosStorage that
// owns the memory and keeps one *native twin*: a non-owning native
// StorageImpl over the same bytes, shared by all views of it.
//
// Contract:
//  - the twin is valid while it describes the storage: same data pointer and
//    byte size (twin_of() checks; a storage whose memory was replaced behind
//    our back simply gets a fresh storage per call, as before);
//  - code that replaces a FlagosStorage's memory (resize, a kernel that grew
//    a view's storage) calls set_memory(), which keeps the twin in step;
//  - a twin never owns memory: the flagos storage frees it, so a twin must not
//    outlive a kernel call in any object the caller keeps.

#include <typeinfo>

#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>

#include "runtime/thread_cache.h"

namespace torch_fl::runtime {

class FlagosStorage final : public c10::StorageImpl {
 public:
  // A storage with a twin made for it (none for a symbolic size).
  FlagosStorage(use_byte_size_t, c10::SymInt size_bytes, c10::DataPtr data_ptr,
                c10::Allocator* allocator, bool resizable);

  // The twin whether or not it is valid; nullptr when `storage` is not a
  // FlagosStorage (or has none).
  static c10::StorageImpl* attached_twin(c10::StorageImpl* storage) noexcept {
    if (typeid(*storage) != typeid(FlagosStorage)) return nullptr;
    return static_cast<FlagosStorage*>(storage)->twin_.get();
  }

  // The twin, or nullptr when `storage` is not a FlagosStorage or its memory
  // changed without set_memory(). Cheap: a type check and two compares (it
  // runs for every tensor argument of every routed call).
  static c10::StorageImpl* twin_of(c10::StorageImpl* storage) noexcept {
    c10::StorageImpl* twin = attached_twin(storage);
    // A storage with a twin has a concrete size (symbolic ones get none), so
    // nbytes() is safe; comparing SymInts would go through SymBool.
    if (twin == nullptr || twin->data_ptr().get() != storage->data_ptr().get() ||
        twin->nbytes() != storage->nbytes()) {
      return nullptr;
    }
    return twin;
  }

  // A storage owning `data_ptr` whose `twin` already points, owning nothing,
  // at the same bytes. Only make_flagos_storage_over can name the key.
  class TwinPointed {
    TwinPointed() = default;
    friend c10::intrusive_ptr<c10::StorageImpl> make_flagos_storage_over(c10::StorageImpl*,
                                                                          c10::DeviceIndex);
  };
  FlagosStorage(TwinPointed, size_t nbytes, c10::DataPtr data_ptr,
                c10::intrusive_ptr<c10::StorageImpl> twin);

  // Replaces the memory (and size) of the storage and re-points the twin.
  void set_memory(c10::DataPtr data_ptr, size_t nbytes);

  // One is made and freed per routed result: memory from a per-thread cache.
  static void* operator new(size_t n) { return ThreadCache<FlagosStorage>::allocate(n); }
  static void operator delete(void* p, size_t n) noexcept {
    ThreadCache<FlagosStorage>::release(p, n);
  }

 private:
  void point_twin();
  c10::intrusive_ptr<c10::StorageImpl> twin_;
};

// A new flagos storage owning `data_ptr` (labelled flagos); allocations and
// resizes go through the flagos allocator.
c10::intrusive_ptr<c10::StorageImpl> make_flagos_storage(size_t nbytes, c10::DataPtr data_ptr);

// Hands over the memory `storage` owns, labelled `label`, and leaves `storage`
// pointing at the same bytes without owning them, as a twin does.
c10::DataPtr take_memory(c10::StorageImpl& storage, c10::Device label);

// A new flagos storage taking over the memory of `native`, a storage that a
// kernel's result holds alone and that can serve as a twin (usable_as_twin):
// the memory moves to the flagos storage (labelled flagos `device`, see
// take_memory), and `native` stays behind as its twin.
c10::intrusive_ptr<c10::StorageImpl> make_flagos_storage_over(c10::StorageImpl* native,
                                                              c10::DeviceIndex device);

// A flagos storage of `nbytes` fresh bytes on `device`.
c10::intrusive_ptr<c10::StorageImpl> allocate_flagos_storage(c10::DeviceIndex device,
                                                             size_t nbytes);

// A non-owning storage of the native device type over `storage`'s bytes,
// resizable through the native allocator (a kernel that grows it allocates
// flagos memory; see native_allocation.h).
c10::intrusive_ptr<c10::StorageImpl> make_native_twin(const c10::StorageImpl& storage);

// Grows (or shrinks) a flagos storage to `nbytes`, keeping its first
// min(old, new) bytes: what resize_ and UntypedStorage.resize_ need.
void resize_storage_bytes(c10::StorageImpl& storage, size_t nbytes);

// Gives `storage` new memory of `nbytes`: through FlagosStorage::set_memory
// (its twin follows) where it is one, else directly.
void replace_memory(c10::StorageImpl& storage, c10::DataPtr data_ptr, size_t nbytes);

// Whether `storage` can serve as a twin as it is (native allocator, resizable).
bool usable_as_twin(const c10::StorageImpl& storage) noexcept;

}  // namespace torch_fl::runtime
