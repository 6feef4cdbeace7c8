#pragma once

// PyTorch's PrivateUse1 hooks for flagos: generators, pinned memory, device
// queries, lazy init and storage resizing, as generic ATen code asks for them.

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace torch_fl::runtime {

struct FlagosHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override;
  bool isAvailable() const override;
  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device_index) const override;
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override;
  at::Device getDeviceFromPtr(void* data) const override;
  bool isPinnedPtr(const void* data) const override;
  at::Allocator* getPinnedMemoryAllocator() const override;
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override;
  void init() const override;
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t newsize) const override;
  c10::DeviceIndex deviceCount() const override;
  void setCurrentDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex getCurrentDevice() const override;
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override;
};

// Registers the hooks (idempotent); done at library load.
void register_hooks();

}  // namespace torch_fl::runtime
