#include "runtime/hooks.h"

#include "runtime/allocator.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/generator.h"
#include "runtime/host_allocator.h"
#include "runtime/storage.h"
#include "runtime/stream.h"

namespace torch_fl::runtime {

bool FlagosHooks::isBuilt() const { return true; }

bool FlagosHooks::isAvailable() const { return device_count() > 0; }

const at::Generator& FlagosHooks::getDefaultGenerator(
    c10::DeviceIndex device_index) const {
  return default_generator(device_index);
}

at::Generator FlagosHooks::getNewGenerator(c10::DeviceIndex device_index) const {
  return new_generator(device_index);
}

at::Device FlagosHooks::getDeviceFromPtr(void* data) const {
  // The host driver cannot tell devices apart by address; the current device
  // is what at::from_blob(ptr, ..., device="flagos") means.
  (void)data;
  return at::Device(kFlagos, current_device());
}

bool FlagosHooks::isPinnedPtr(const void* data) const {
  return uses_cuda() ? cuda::is_pinned(data) : is_pinned_ptr(data);
}

at::Allocator* FlagosHooks::getPinnedMemoryAllocator() const {
  // On the cuda driver, pinned means page-locked by CUDA, so that
  // non_blocking copies really overlap.
  return uses_cuda() ? cuda::pinned_allocator() : pinned_host_allocator();
}

bool FlagosHooks::hasPrimaryContext(c10::DeviceIndex device_index) const {
  return device_index >= 0 && device_index < device_count();
}

void FlagosHooks::init() const { lazy_init(); }

void FlagosHooks::resizePrivateUse1Bytes(const c10::Storage& storage,
                                         size_t newsize) const {
  resize_storage_bytes(*storage.unsafeGetStorageImpl(), newsize);
}

c10::DeviceIndex FlagosHooks::deviceCount() const { return device_count(); }

void FlagosHooks::setCurrentDevice(c10::DeviceIndex device) const {
  set_device(device);
}

c10::DeviceIndex FlagosHooks::getCurrentDevice() const {
  return current_device();
}

c10::DeviceIndex FlagosHooks::exchangeDevice(c10::DeviceIndex device) const {
  auto prev = current_device();
  if (device != prev) set_device(device);
  return prev;
}

c10::DeviceIndex FlagosHooks::maybeExchangeDevice(
    c10::DeviceIndex device) const {
  return exchangeDevice(device);
}

void register_hooks() {
  static bool done = [] {
    at::RegisterPrivateUse1HooksInterface(new FlagosHooks());
    return true;
  }();
  (void)done;
}

static const bool kRegistered = (register_hooks(), true);

}  // namespace torch_fl::runtime
