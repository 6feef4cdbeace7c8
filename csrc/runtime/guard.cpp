#include "runtime/guard.h"

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace torch_fl::runtime {

using c10::Device;
using c10::DeviceIndex;
using c10::Stream;

c10::DeviceType FlagosGuardImpl::type() const { return kFlagos; }

Device FlagosGuardImpl::exchangeDevice(Device d) const {
  auto prev = getDevice();
  if (d.index() != prev.index()) setDevice(d);
  return prev;
}

Device FlagosGuardImpl::getDevice() const {
  return Device(kFlagos, current_device());
}

void FlagosGuardImpl::setDevice(Device d) const {
  TORCH_CHECK(d.type() == kFlagos, "expected a flagos device, got ", d);
  set_device(d.index());
}

void FlagosGuardImpl::uncheckedSetDevice(Device d) const noexcept {
  try {
    set_device(d.index());
  } catch (...) {
    // The contract forbids throwing; guards restore devices that were valid.
  }
}

Stream FlagosGuardImpl::getStream(Device d) const {
  return current_stream(d.index());
}

Stream FlagosGuardImpl::getDefaultStream(Device d) const {
  return default_stream(d.index());
}

Stream FlagosGuardImpl::getStreamFromGlobalPool(Device d,
                                                bool isHighPriority) const {
  return pool_stream(d.index(), isHighPriority);
}

Stream FlagosGuardImpl::getNewStream(Device d, int priority) const {
  return new_stream(d.index(), priority);
}

Stream FlagosGuardImpl::exchangeStream(Stream s) const {
  return exchange_stream(s);
}

DeviceIndex FlagosGuardImpl::deviceCount() const noexcept {
  return device_count();
}

void FlagosGuardImpl::destroyEvent(void* event, DeviceIndex) const noexcept {
  if (event != nullptr) driver().destroyEvent(event);
}

void FlagosGuardImpl::record(void** event, const Stream& stream,
                             DeviceIndex device_index,
                             c10::EventFlag flag) const {
  TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
              "event of flagos:", static_cast<int>(device_index),
              " cannot be recorded on a stream of flagos:",
              static_cast<int>(stream.device_index()));
  auto handle = stream_handle(stream);
  if (*event == nullptr) {
    // BACKEND_DEFAULT is what torch.Event(enable_timing=True) asks for.
    *event = driver().createEvent(stream.device_index(),
                                  flag == c10::EventFlag::BACKEND_DEFAULT);
  }
  driver().recordEvent(*event, handle);
}

void FlagosGuardImpl::block(void* event, const Stream& stream) const {
  if (event == nullptr) return;  // never recorded: nothing to wait for
  driver().streamWaitEvent(stream_handle(stream), event);
}

bool FlagosGuardImpl::queryEvent(void* event) const {
  return event == nullptr || driver().queryEvent(event);
}

void FlagosGuardImpl::synchronizeEvent(void* event) const {
  if (event != nullptr) driver().synchronizeEvent(event);
}

double FlagosGuardImpl::elapsedTime(void* event1, void* event2,
                                    DeviceIndex) const {
  TORCH_CHECK(event1 != nullptr && event2 != nullptr,
              "elapsed_time needs both events to be recorded first");
  try {
    return driver().elapsedMs(event1, event2);
  } catch (const hal::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

bool FlagosGuardImpl::queryStream(const Stream& stream) const {
  return driver().queryStream(stream_handle(stream));
}

void FlagosGuardImpl::synchronizeStream(const Stream& stream) const {
  driver().synchronizeStream(stream_handle(stream));
}

void FlagosGuardImpl::synchronizeDevice(DeviceIndex device_index) const {
  driver().synchronizeDevice(resolve_device(device_index));
}

void FlagosGuardImpl::recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                                            const Stream& stream) const {
  device_allocator().recordStream(data_ptr, stream);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl)

}  // namespace torch_fl::runtime
