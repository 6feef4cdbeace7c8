#include "aten/native_view.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <typeinfo>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/storage.h"

namespace torch_fl::aten {
namespace {

using runtime::FlagosStorage;
using runtime::kFlagos;

// Decided by the driver, which is selected once per process before any
// tensor exists; read on every view, so computed once.
c10::DispatchKey native_key() {
  static const c10::DispatchKey key =
      runtime::driver().nativeDevice() == hal::NativeDevice::kHost ? c10::DispatchKey::CPU
                                                                    : c10::DispatchKey::CUDA;
  return key;
}

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

void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

}  // namespace

c10::DeviceType NativeViews::native_type() {
  static const c10::DeviceType type = native_key() == c10::DispatchKey::CPU
                                          ? c10::DeviceType::CPU
                                          : c10::DeviceType::CUDA;
  return type;
}

at::Tensor flagos_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

at::Tensor NativeViews::to_native(const at::Tensor& flagos) {
  if (!flagos.defined()) return flagos;
  c10::StorageImpl* fs = flagos.storage().unsafeGetStorageImpl();
  c10::Storage* native = nullptr;
  for (auto& p : storages_) {
    if (p.flagos == fs) {
      native = &p.native;
      break;
    }
  }
  if (native == nullptr) {
    // The storage's twin when it has a valid one (every storage flagos made),
    // else a native storage for this call alone.
    c10::StorageImpl* twin = FlagosStorage::twin_of(fs);
    c10::Storage storage(twin != nullptr
                             ? c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(twin)
                             : runtime::make_native_twin(*fs));
    storages_.push_back({fs, std::move(storage), fs->data_ptr().get()});
    native = &storages_.back().native;
  }
  at::Tensor view = tensor_on(*native, native_key(), flagos);
  tensors_.push_back({view.unsafeGetTensorImpl(), flagos});
  return view;
}

void NativeViews::sync_back(const at::Tensor& flagos,
                            const at::Tensor& native_view) {
  if (!flagos.defined()) return;
  c10::StorageImpl* ns = native_view.storage().unsafeGetStorageImpl();
  c10::StorageImpl* fs = flagos.storage().unsafeGetStorageImpl();
  for (auto& p : storages_) {
    if (p.native.unsafeGetStorageImpl() != ns) continue;
    if (ns->data_ptr().get() != p.original_data || ns->nbytes() != fs->nbytes()) {
      // The kernel grew the storage: its new memory came from the flagos
      // allocator (capturing scope), so it moves over without a copy, and the
      // native storage points at it again, owning nothing.
      const size_t nbytes = ns->nbytes();
      c10::DataPtr grown = ns->set_data_ptr(
          c10::DataPtr(p.original_data, ns->data_ptr().device()));
      TORCH_INTERNAL_ASSERT(runtime::FlagosAllocator::owns(grown),
                            "grown storage was not allocated by flagos");
      grown.unsafe_set_device(flagos.device());
      if (typeid(*fs) == typeid(FlagosStorage)) {
        static_cast<FlagosStorage*>(fs)->set_memory(std::move(grown), nbytes);
      } else {
        fs->set_data_ptr_noswap(std::move(grown));
        fs->set_nbytes(nbytes);
      }
      p.original_data = fs->data_ptr().get();
    }
    break;
  }
  auto* fimpl = flagos.unsafeGetTensorImpl();
  if (flagos.sizes() != native_view.sizes() ||
      flagos.strides() != native_view.strides() ||
      flagos.storage_offset() != native_view.storage_offset()) {
    fimpl->set_sizes_and_strides(native_view.sizes(), native_view.strides(),
                                 native_view.storage_offset());
  }
}

at::Tensor NativeViews::to_flagos(const at::Tensor& native,
                                  c10::DeviceIndex device) {
  if (!native.defined() || native.device().type() == kFlagos) return native;
  auto* impl = native.unsafeGetTensorImpl();
  for (auto& t : tensors_) {
    if (t.native == impl) return t.flagos;
  }
  c10::StorageImpl* ns = native.storage().unsafeGetStorageImpl();
  for (auto& p : storages_) {
    if (p.native.unsafeGetStorageImpl() == ns) {
      return flagos_tensor_on(
          c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::
                           reclaim_copy(p.flagos)),
          native);
    }
  }
  for (auto& a : adopted_) {
    if (a.first == ns) return flagos_tensor_on(a.second, native);
  }
  if (native.device().type() != native_type()) {
    // A result on some third device type (e.g. a CPU scalar from a CUDA op):
    // returned as it is, as the native op would.
    return native;
  }
  const c10::DataPtr& dp = ns->data_ptr();
  const size_t nbytes = ns->nbytes();
  c10::Storage flagos_storage;
  if (runtime::FlagosAllocator::owns(dp) && native.storage().use_count() == 1) {
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
  return flagos_tensor_on(std::move(flagos_storage), native);
}

}  // namespace torch_fl::aten
