#include "runtime/storage.h"

#include <algorithm>
#include <typeinfo>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/stream.h"

namespace torch_fl::runtime {
namespace {

c10::Device native_device_of(const c10::StorageImpl& storage) {
  if (driver().nativeDevice() == hal::NativeDevice::kHost) return c10::Device(c10::kCPU);
  return c10::Device(c10::kCUDA, storage.device().index());
}

// PyTorch's own storage constructors for flagos (torch.UntypedStorage(n,
// device="flagos"), deserialisation) come here: flagos storages always carry
// a twin. A null data pointer means "allocate", also for zero bytes: PyTorch
// passes a default DataPtr, which is labelled CPU, and the storage's device
// is its DataPtr's (an empty flagos tensor saved, loaded or deep-copied
// must stay on flagos).
c10::intrusive_ptr<c10::StorageImpl> create_storage(c10::StorageImpl::use_byte_size_t,
                                                    c10::SymInt size_bytes,
                                                    c10::DataPtr data_ptr,
                                                    c10::Allocator* allocator,
                                                    bool resizable) {
  const size_t nbytes = static_cast<size_t>(size_bytes.expect_int());
  if (data_ptr.get() == nullptr) {
    if (allocator != nullptr) {
      data_ptr = allocator->allocate(nbytes);
    } else {
      TORCH_CHECK(nbytes == 0, "flagos: a storage of ", nbytes,
                  " bytes needs an allocator or memory");
      data_ptr = c10::DataPtr(nullptr, c10::Device(kFlagos, current_device()));
    }
  }
  return c10::make_intrusive<FlagosStorage>(c10::StorageImpl::use_byte_size_t(),
                                            std::move(size_bytes), std::move(data_ptr),
                                            allocator, resizable);
}

}  // namespace

FlagosStorage::FlagosStorage(use_byte_size_t, c10::SymInt size_bytes, c10::DataPtr data_ptr,
                             c10::Allocator* allocator, bool resizable)
    : c10::StorageImpl(use_byte_size_t(), std::move(size_bytes), std::move(data_ptr),
                       allocator, resizable) {
  if (sym_nbytes().is_heap_allocated()) return;  // symbolic: never viewed natively
  twin_ = make_native_twin(*this);
}

FlagosStorage::FlagosStorage(TwinPointed, size_t nbytes, c10::DataPtr data_ptr,
                             c10::intrusive_ptr<c10::StorageImpl> twin)
    : c10::StorageImpl(use_byte_size_t(), static_cast<int64_t>(nbytes), std::move(data_ptr),
                       &device_allocator(), /*resizable=*/true),
      twin_(std::move(twin)) {}

void FlagosStorage::point_twin() {
  twin_->set_data_ptr_noswap(c10::DataPtr(data_ptr().get(), native_device_of(*this)));
  twin_->set_nbytes(nbytes());
}

void FlagosStorage::set_memory(c10::DataPtr data_ptr, size_t nbytes) {
  set_data_ptr_noswap(std::move(data_ptr));
  set_nbytes(nbytes);
  if (twin_) point_twin();
}

c10::intrusive_ptr<c10::StorageImpl> make_flagos_storage(size_t nbytes, c10::DataPtr data_ptr) {
  return c10::make_intrusive<FlagosStorage>(c10::StorageImpl::use_byte_size_t(),
                                            static_cast<int64_t>(nbytes), std::move(data_ptr),
                                            &device_allocator(), /*resizable=*/true);
}

c10::DataPtr take_memory(c10::StorageImpl& storage, c10::Device label) {
  // One swap: a non-owning pointer over the same bytes goes in.
  const c10::DataPtr& owned = storage.data_ptr();
  c10::DataPtr taken = storage.set_data_ptr(c10::DataPtr(owned.get(), owned.device()));
  taken.unsafe_set_device(label);
  return taken;
}

c10::intrusive_ptr<c10::StorageImpl> make_flagos_storage_over(c10::StorageImpl* native,
                                                              c10::DeviceIndex device) {
  const size_t nbytes = native->nbytes();
  c10::DataPtr memory = take_memory(*native, c10::Device(kFlagos, device));
  return c10::make_intrusive<FlagosStorage>(
      FlagosStorage::TwinPointed(), nbytes, std::move(memory),
      c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(native));
}

c10::intrusive_ptr<c10::StorageImpl> allocate_flagos_storage(c10::DeviceIndex device,
                                                             size_t nbytes) {
  return make_flagos_storage(nbytes, device_allocator().allocate_on(device, nbytes, kFlagos));
}

c10::intrusive_ptr<c10::StorageImpl> make_native_twin(const c10::StorageImpl& storage) {
  // Resizable with the native allocator: a kernel that grows a view's storage
  // (out= with a wrong size) allocates flagos memory, which the caller then
  // moves into the flagos storage (set_memory).
  return c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), static_cast<int64_t>(storage.nbytes()),
      c10::DataPtr(storage.data_ptr().get(), native_device_of(storage)), native_allocator(),
      /*resizable=*/true);
}

void resize_storage_bytes(c10::StorageImpl& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(),
              "cannot resize a flagos storage that is not resizable (it is shared with "
              "another process, or wraps memory that flagos does not own)");
  auto device = storage.device().index();
  c10::DataPtr fresh = device_allocator().allocate_on(device, nbytes, kFlagos);
  size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) {
    driver().copy(fresh.get(), storage.data_ptr().get(), keep,
                  hal::CopyKind::kDeviceToDevice, current_stream_handle(device),
                  /*async=*/false);
  }
  replace_memory(storage, std::move(fresh), nbytes);
}

void replace_memory(c10::StorageImpl& storage, c10::DataPtr data_ptr, size_t nbytes) {
  if (typeid(storage) == typeid(FlagosStorage)) {
    static_cast<FlagosStorage&>(storage).set_memory(std::move(data_ptr), nbytes);
  } else {
    storage.set_data_ptr_noswap(std::move(data_ptr));
    storage.set_nbytes(nbytes);
  }
}

bool usable_as_twin(const c10::StorageImpl& storage) noexcept {
  return storage.resizable() && storage.allocator() == native_allocator() &&
         !storage.sym_nbytes().is_heap_allocated();
}

// Registered at load, before any flagos storage can be made.
static const bool kCreatorRegistered =
    (c10::SetStorageImplCreate(kFlagos, &create_storage), true);

}  // namespace torch_fl::runtime
