#include "aten/native_view.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"

namespace torch_fl::aten {
namespace {

using runtime::kFlagos;

c10::DispatchKey native_key() {
  return runtime::driver().nativeDevice() == hal::NativeDevice::kHost
             ? c10::DispatchKey::CPU
             : c10::DispatchKey::CUDA;
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
  return runtime::driver().nativeDevice() == hal::NativeDevice::kHost
             ? c10::DeviceType::CPU
             : c10::DeviceType::CUDA;
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
    void* data = fs->data_ptr().get();
    c10::Device dev(native_type(),
                    native_type() == c10::DeviceType::CPU
                        ? c10::DeviceIndex(-1)
                        : flagos.device().index());
    // Resizable, with the capturing allocator: a CPU kernel that grows the
    // storage (out= with a wrong size) then allocates flagos memory, and
    // sync_back() moves it into the flagos storage.
    auto impl = c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), fs->nbytes(),
        c10::DataPtr(data, dev), runtime::native_allocator(),
        /*resizable=*/true);
    storages_.push_back({fs, c10::Storage(std::move(impl)), data});
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
      // allocator (capturing scope), so it moves over without a copy.
      c10::DataPtr grown = ns->set_data_ptr(
          c10::DataPtr(p.original_data, ns->data_ptr().device()));
      TORCH_INTERNAL_ASSERT(runtime::FlagosAllocator::owns(grown),
                            "grown storage was not allocated by flagos");
      grown.unsafe_set_device(flagos.device());
      fs->set_data_ptr_noswap(std::move(grown));
      fs->set_nbytes(ns->nbytes());
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
  c10::Storage flagos_storage;
  if (runtime::FlagosAllocator::owns(dp) && native.storage().use_count() == 1) {
    // Flagos memory already (the host driver's capturing scope, or the CUDA
    // caching allocator), held by this result alone: the allocation itself
    // moves to a flagos storage, so it frees (and record_stream works)
    // exactly as for any flagos tensor.
    c10::DataPtr moved = ns->set_data_ptr(c10::DataPtr(nullptr, dp.device()));
    moved.unsafe_set_device(c10::Device(kFlagos, device));
    flagos_storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), ns->nbytes(), std::move(moved),
        &runtime::device_allocator(), /*resizable=*/true));
  } else if (dp.get() == nullptr || runtime::FlagosAllocator::owns(dp)) {
    // Flagos memory shared with other native tensors: the flagos storage
    // keeps the native one alive and frees through it.
    c10::raw::intrusive_ptr::incref(ns);
    c10::DataPtr ref(dp.get(), ns, &release_storage_ref,
                     c10::Device(kFlagos, device));
    flagos_storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), ns->nbytes(), std::move(ref),
        &runtime::device_allocator(), /*resizable=*/true));
  } else {
    // Memory from elsewhere (a kernel's cached constant, another allocator):
    // copied, so that every flagos storage is flagos memory.
    c10::DataPtr fresh = runtime::device_allocator().allocate_on(
        device, ns->nbytes(), kFlagos);
    if (ns->nbytes() > 0) {
      runtime::driver().copy(fresh.get(), dp.get(), ns->nbytes(),
                             hal::CopyKind::kDeviceToDevice, nullptr, false);
    }
    flagos_storage = c10::Storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), ns->nbytes(), std::move(fresh),
        &runtime::device_allocator(), /*resizable=*/true));
  }
  adopted_.emplace_back(ns, flagos_storage);
  return flagos_tensor_on(std::move(flagos_storage), native);
}

}  // namespace torch_fl::aten
