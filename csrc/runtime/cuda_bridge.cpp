#include "runtime/cuda_bridge.h"

#include "runtime/device.h"

#include <c10/util/Exception.h>

#ifdef FLAGOS_WITH_CUDA
#include <ATen/Context.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/PinnedMemoryAllocator.h>
#include <ATen/cuda/Sleep.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace torch_fl::runtime {

bool uses_cuda() {
#ifdef FLAGOS_WITH_CUDA
  static const bool cuda = driver().nativeDevice() == hal::NativeDevice::kCuda;
  return cuda;
#else
  return false;
#endif
}

#ifdef FLAGOS_WITH_CUDA
namespace cuda {
namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::Stream;

// Validates on the way in: PyTorch's CUDA guard assumes a valid ordinal.
Device to_cuda(Device d) {
  if (d.index() >= 0) check_device_index(d.index());
  return Device(c10::kCUDA, d.index());
}
Device to_flagos(Device d) { return Device(kFlagos, d.index()); }
Stream to_cuda(const Stream& s) {
  return Stream(Stream::UNSAFE, to_cuda(s.device()), s.id());
}
Stream to_flagos(const Stream& s) {
  return Stream(Stream::UNSAFE, to_flagos(s.device()), s.id());
}

struct CudaForwardingGuard final : public c10::impl::DeviceGuardImplInterface {
  const c10::impl::DeviceGuardImplInterface* c =
      c10::impl::getDeviceGuardImpl(c10::kCUDA);

  c10::DeviceType type() const override { return kFlagos; }
  Device exchangeDevice(Device d) const override {
    return to_flagos(c->exchangeDevice(to_cuda(d)));
  }
  Device getDevice() const override { return to_flagos(c->getDevice()); }
  void setDevice(Device d) const override { c->setDevice(to_cuda(d)); }
  void uncheckedSetDevice(Device d) const noexcept override {
    c->uncheckedSetDevice(to_cuda(d));
  }
  Stream getStream(Device d) const override { return to_flagos(c->getStream(to_cuda(d))); }
  Stream getDefaultStream(Device d) const override {
    return to_flagos(c->getDefaultStream(to_cuda(d)));
  }
  Stream getStreamFromGlobalPool(Device d, bool high) const override {
    return to_flagos(c->getStreamFromGlobalPool(to_cuda(d), high));
  }
  Stream getNewStream(Device d, int priority) const override {
    return to_flagos(c->getNewStream(to_cuda(d), priority));
  }
  Stream exchangeStream(Stream s) const override {
    return to_flagos(c->exchangeStream(to_cuda(s)));
  }
  DeviceIndex deviceCount() const noexcept override { return c->deviceCount(); }
  void destroyEvent(void* e, DeviceIndex i) const noexcept override { c->destroyEvent(e, i); }
  void record(void** e, const Stream& s, DeviceIndex i, c10::EventFlag f) const override {
    c->record(e, to_cuda(s), i, f);
  }
  void block(void* e, const Stream& s) const override { c->block(e, to_cuda(s)); }
  bool queryEvent(void* e) const override { return c->queryEvent(e); }
  void synchronizeEvent(void* e) const override { c->synchronizeEvent(e); }
  double elapsedTime(void* a, void* b, DeviceIndex i) const override {
    return c->elapsedTime(a, b, i);
  }
  bool queryStream(const Stream& s) const override { return c->queryStream(to_cuda(s)); }
  void synchronizeStream(const Stream& s) const override { c->synchronizeStream(to_cuda(s)); }
  void synchronizeDevice(DeviceIndex i) const override { c->synchronizeDevice(i); }
  void recordDataPtrOnStream(const c10::DataPtr& p, const Stream& s) const override {
    c->recordDataPtrOnStream(p, to_cuda(s));
  }
};

c10::cuda::CUDACachingAllocator::CUDAAllocator* alloc() {
  return c10::cuda::CUDACachingAllocator::get();
}

}  // namespace

void lazy_init() { at::globalContext().lazyInitDevice(c10::kCUDA); }

const c10::impl::DeviceGuardImplInterface& guard() {
  static auto* g = new CudaForwardingGuard();
  return *g;
}

c10::DataPtr allocate(DeviceIndex device, size_t nbytes) {
  c10::cuda::CUDAGuard guard(device);
  c10::DataPtr p = alloc()->allocate(nbytes);
  p.unsafe_set_device(Device(kFlagos, device));
  return p;
}

bool owns(const c10::DataPtr& ptr) {
  // The allocator cannot change once CUDA is initialised (PyTorch refuses
  // change_current_allocator then), and flagos memory exists only after that.
  static const c10::DeleterFnPtr deleter = alloc()->raw_deleter();
  return ptr.get_deleter() == deleter;
}

c10::Allocator* native_allocator() { return alloc(); }

c10::CachingDeviceAllocator::DeviceStats stats(DeviceIndex device) {
  return alloc()->getDeviceStats(device);
}
void reset_peak(DeviceIndex device) { alloc()->resetPeakStats(device); }
void reset_accumulated(DeviceIndex device) { alloc()->resetAccumulatedStats(device); }
void empty_cache() { alloc()->emptyCache(); }
void set_memory_fraction(DeviceIndex device, double fraction) {
  lazy_init();  // the allocator keeps a fraction per initialised device
  alloc()->setMemoryFraction(fraction, device);
}
double memory_fraction(DeviceIndex device) {
  lazy_init();
  return alloc()->getMemoryFraction(device);
}

void record_stream(const c10::DataPtr& ptr, const c10::Stream& s) {
  alloc()->recordStream(ptr, c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, to_cuda(s)));
}

hal::StreamHandle current_stream_handle(DeviceIndex device) {
  return c10::cuda::getCurrentCUDAStream(device).stream();
}

c10::Allocator* pinned_allocator() { return at::cuda::getPinnedMemoryAllocator(); }

bool is_pinned(const void* ptr) { return at::detail::getCUDAHooks().isPinnedPtr(ptr); }

const at::Generator& default_generator(DeviceIndex device) {
  return at::cuda::detail::getDefaultCUDAGenerator(device);
}

at::Generator new_generator(DeviceIndex device) {
  return at::cuda::detail::createCUDAGenerator(device);
}

void spin(int64_t cycles) { at::cuda::sleep(cycles); }

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

}  // namespace cuda
#else  // !FLAGOS_WITH_CUDA: never called (uses_cuda() is false), but linked.
namespace cuda {
namespace {
[[noreturn]] void no_cuda() {
  TORCH_INTERNAL_ASSERT(false, "torch_fl was built without CUDA");
}
}  // namespace
void lazy_init() { no_cuda(); }
const c10::impl::DeviceGuardImplInterface& guard() { no_cuda(); }
c10::DataPtr allocate(c10::DeviceIndex, size_t) { no_cuda(); }
bool owns(const c10::DataPtr&) { return false; }
c10::Allocator* native_allocator() { no_cuda(); }
c10::CachingDeviceAllocator::DeviceStats stats(c10::DeviceIndex) { no_cuda(); }
void reset_peak(c10::DeviceIndex) { no_cuda(); }
void reset_accumulated(c10::DeviceIndex) { no_cuda(); }
void empty_cache() { no_cuda(); }
void set_memory_fraction(c10::DeviceIndex, double) { no_cuda(); }
double memory_fraction(c10::DeviceIndex) { no_cuda(); }
void record_stream(const c10::DataPtr&, const c10::Stream&) { no_cuda(); }
hal::StreamHandle current_stream_handle(c10::DeviceIndex) { no_cuda(); }
c10::Allocator* pinned_allocator() { no_cuda(); }
bool is_pinned(const void*) { return false; }
const at::Generator& default_generator(c10::DeviceIndex) { no_cuda(); }
at::Generator new_generator(c10::DeviceIndex) { no_cuda(); }
void spin(int64_t) { no_cuda(); }
bool capturing() { return false; }
}  // namespace cuda
#endif  // FLAGOS_WITH_CUDA

}  // namespace torch_fl::runtime
