#pragma once

// c10's device guard for flagos: device switching, streams and events as
// PyTorch's generic code (torch.Stream, torch.Event, torch.accelerator,
// autograd's stream handling) sees them.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "runtime/version.h"

namespace torch_fl::runtime {

struct FlagosGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override;
  c10::Device exchangeDevice(c10::Device d) const override;
  c10::Device getDevice() const override;
  void setDevice(c10::Device d) const override;
  void uncheckedSetDevice(c10::Device d) const noexcept override;
  c10::Stream getStream(c10::Device d) const override;
  c10::Stream getDefaultStream(c10::Device d) const override;
  c10::Stream getStreamFromGlobalPool(c10::Device d,
                                      bool isHighPriority) const override;
  c10::Stream getNewStream(c10::Device d, int priority) const override;
  c10::Stream exchangeStream(c10::Stream s) const override;
  c10::DeviceIndex deviceCount() const noexcept override;
#if FLAGOS_TORCH_HAS_DEVICE_CAPABILITY
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override;
#endif

  void destroyEvent(void* event, c10::DeviceIndex device_index)
      const noexcept override;
  void record(void** event, const c10::Stream& stream,
              c10::DeviceIndex device_index,
              c10::EventFlag flag) const override;
  void block(void* event, const c10::Stream& stream) const override;
  bool queryEvent(void* event) const override;
  void synchronizeEvent(void* event) const override;
  double elapsedTime(void* event1, void* event2,
                     c10::DeviceIndex device_index) const override;

  bool queryStream(const c10::Stream& stream) const override;
  void synchronizeStream(const c10::Stream& stream) const override;
  void synchronizeDevice(c10::DeviceIndex device_index) const override;
  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override;
};

}  // namespace torch_fl::runtime
