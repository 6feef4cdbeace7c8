#include "runtime/guard.h"

#include "runtime/allocator.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/intra_op_threads.h"
#include "runtime/stream.h"

namespace torch_fl::runtime {

using c10::Device;
using c10::DeviceIndex;
using c10::Stream;

namespace {
// On the cuda driver every call goes to PyTorch's CUDA guard (cuda_bridge).
const c10::impl::DeviceGuardImplInterface* forward() {
  return uses_cuda() ? &cuda::guard() : nullptr;
}
}  // namespace

c10::DeviceType FlagosGuardImpl::type() const { return kFlagos; }

Device FlagosGuardImpl::exchangeDevice(Device d) const {
  if (auto* f = forward()) return f->exchangeDevice(d);
  auto prev = getDevice();
  if (d.index() != prev.index()) setDevice(d);
  return prev;
}

Device FlagosGuardImpl::getDevice() const {
  if (auto* f = forward()) return f->getDevice();
  return Device(kFlagos, current_device());
}

void FlagosGuardImpl::setDevice(Device d) const {
  if (auto* f = forward()) return f->setDevice(d);
  TORCH_CHECK(d.type() == kFlagos, "expected a flagos device, got ", d);
  set_device(d.index());
}

void FlagosGuardImpl::uncheckedSetDevice(Device d) const noexcept {
  try {
    if (auto* f = forward()) return f->uncheckedSetDevice(d);
    set_device(d.index());
  } catch (...) {
    // The contract forbids throwing; guards restore devices that were valid.
  }
}

Stream FlagosGuardImpl::getStream(Device d) const {
  if (auto* f = forward()) return f->getStream(d);
  return current_stream(d.index());
}

Stream FlagosGuardImpl::getDefaultStream(Device d) const {
  if (auto* f = forward()) return f->getDefaultStream(d);
  return default_stream(d.index());
}

Stream FlagosGuardImpl::getStreamFromGlobalPool(Device d,
                                                bool isHighPriority) const {
  if (auto* f = forward()) return f->getStreamFromGlobalPool(d, isHighPriority);
  return pool_stream(d.index(), isHighPriority);
}

Stream FlagosGuardImpl::getNewStream(Device d, int priority) const {
  if (auto* f = forward()) return f->getNewStream(d, priority);
  return new_stream(d.index(), priority);
}

Stream FlagosGuardImpl::exchangeStream(Stream s) const {
  if (auto* f = forward()) return f->exchangeStream(s);
  // The autograd engine guards each flagos node's stream on its worker thread.
  follow_backward_threads();
  return exchange_stream(s);
}

DeviceIndex FlagosGuardImpl::deviceCount() const noexcept {
  return device_count();
}

#if FLAGOS_TORCH_HAS_DEVICE_CAPABILITY
// The dtypes a flagos tensor can be allocated in and converted between: every
// dtype but the quantized ones, which flagos tensors never are (a kernel that
// returns one is refused, aten/native_view.cpp). Not forwarded to CUDA's guard
// on the cuda driver: CUDA's answer may be "unsupported", and flagos' set is
// the same on both drivers.
c10::DeviceCapability FlagosGuardImpl::getDeviceCapability(Device d) const {
  TORCH_CHECK(d.type() == kFlagos, "getDeviceCapability: expected a flagos device, got ", d);
  resolve_device(d.has_index() ? d.index() : -1);  // the index must name a device
  c10::DeviceCapability capability;
  for (const int quantized : {c10::kIndex_QInt8, c10::kIndex_QUInt8, c10::kIndex_QInt32,
                               c10::kIndex_QUInt4x2, c10::kIndex_QUInt2x4}) {
    capability.capability_data.capability_bits &= ~(uint64_t{1} << quantized);
  }
  return capability;
}
#endif

void FlagosGuardImpl::destroyEvent(void* event, DeviceIndex index) const noexcept {
  try {
    if (auto* f = forward()) return f->destroyEvent(event, index);
  } catch (...) {
    return;
  }
  if (event != nullptr) driver().destroyEvent(event);
}

void FlagosGuardImpl::record(void** event, const Stream& stream,
                             DeviceIndex device_index,
                             c10::EventFlag flag) const {
  if (auto* f = forward()) return f->record(event, stream, device_index, flag);
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
  if (auto* f = forward()) return f->block(event, stream);
  if (event == nullptr) return;  // never recorded: nothing to wait for
  driver().streamWaitEvent(stream_handle(stream), event);
}

bool FlagosGuardImpl::queryEvent(void* event) const {
  if (auto* f = forward()) return f->queryEvent(event);
  return event == nullptr || driver().queryEvent(event);
}

void FlagosGuardImpl::synchronizeEvent(void* event) const {
  if (auto* f = forward()) return f->synchronizeEvent(event);
  if (event != nullptr) driver().synchronizeEvent(event);
}

double FlagosGuardImpl::elapsedTime(void* event1, void* event2,
                                    DeviceIndex device_index) const {
  if (auto* f = forward()) return f->elapsedTime(event1, event2, device_index);
  TORCH_CHECK(event1 != nullptr && event2 != nullptr,
              "elapsed_time needs both events to be recorded first");
  try {
    return driver().elapsedMs(event1, event2);
  } catch (const hal::Error& e) {
    TORCH_CHECK(false, e.what());
  }
}

bool FlagosGuardImpl::queryStream(const Stream& stream) const {
  if (auto* f = forward()) return f->queryStream(stream);
  return driver().queryStream(stream_handle(stream));
}

void FlagosGuardImpl::synchronizeStream(const Stream& stream) const {
  if (auto* f = forward()) return f->synchronizeStream(stream);
  driver().synchronizeStream(stream_handle(stream));
}

void FlagosGuardImpl::synchronizeDevice(DeviceIndex device_index) const {
  if (auto* f = forward()) return f->synchronizeDevice(device_index);
  driver().synchronizeDevice(resolve_device(device_index));
}

void FlagosGuardImpl::recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                                            const Stream& stream) const {
  if (auto* f = forward()) return f->recordDataPtrOnStream(data_ptr, stream);
  device_allocator().recordStream(data_ptr, stream);
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, FlagosGuardImpl)

}  // namespace torch_fl::runtime
