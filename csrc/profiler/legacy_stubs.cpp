// The profiler's device stubs for flagos: what
// `torch.autograd.profiler.profile(use_device="flagos")` (PyTorch's
// KINETO_PRIVATEUSE1_FALLBACK) calls around every operator to time it on the
// device. Without them PyTorch's defaults throw from every profiling callback
// and the device times come out as garbage.
//
// Written against flagos' device guard alone, so one implementation serves both
// drivers: on the cuda driver the guard hands events and streams to CUDA's,
// on the host driver to the HAL's timed host events.

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

#include "runtime/device.h"

namespace torch_fl::profiler {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

const c10::impl::DeviceGuardImplInterface& guard() {
  return *c10::impl::getDeviceGuardImpl(runtime::kFlagos);
}

// What a ProfilerVoidEventStub points at: the guard's event, and the device it
// was recorded on (elapsedTime and destroyEvent need it).
struct TimedEvent {
  void* event = nullptr;
  c10::DeviceIndex device = -1;
  ~TimedEvent() { guard().destroyEvent(event, device); }
};

struct FlagosProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  // Records an event on the current stream of the current device. PyTorch
  // passes null for `device` and `cpu_ns` when it does not want them.
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = runtime::current_device();
    if (device != nullptr) *device = index;
    auto timed = std::make_shared<TimedEvent>();
    timed->device = index;
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    const c10::Device d(runtime::kFlagos, index);
    // BACKEND_DEFAULT: an event that keeps timing (PYTORCH_DEFAULT drops it).
    guard().record(&timed->event, guard().getStream(d), index, c10::EventFlag::BACKEND_DEFAULT);
    *event = std::move(timed);
  }

  // Microseconds between two recorded events, after both completed.
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    const auto* a = static_cast<const TimedEvent*>(start->get());
    const auto* b = static_cast<const TimedEvent*>(end->get());
    guard().synchronizeEvent(a->event);
    guard().synchronizeEvent(b->event);
    return static_cast<float>(guard().elapsedTime(a->event, b->event, a->device) * 1000.0);
  }

  // Range annotations are an NVTX feature; flagos has no annotation tool.
  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex n = runtime::device_count();
    for (c10::DeviceIndex i = 0; i < n; ++i) {
      c10::DeviceGuard device_guard(c10::Device(runtime::kFlagos, i));
      op(i);
    }
  }

  void synchronize() const override { guard().synchronizeDevice(runtime::current_device()); }
};

const bool kRegistered = [] {
  static FlagosProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace torch_fl::profiler
