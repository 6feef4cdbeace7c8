// DDP's Reducer times forward, backward compute and backward communication
// with a c10d::Timer made for the parameters' device type; PyTorch ships
// timers for CPU and CUDA only, and asks other devices to register theirs
// (otherwise DDP warns and logs no time stats). This one records flagos
// events on the current flagos stream: on the cuda driver they are CUDA
// events, on the host driver steady-clock stamps.

#include <array>
#include <optional>

#include <c10/core/DeviceGuard.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include "runtime/device.h"

namespace torch_fl::distributed {
namespace {

class FlagosTimer final : public c10d::Timer {
 public:
  explicit FlagosTimer(c10::Device device) : device_(device) {}

  void record(Event event) override {
    Timer::record(event);  // the host-side time
    c10::DeviceGuard guard(device_);
    auto& slot = events_.at(static_cast<size_t>(event));
    slot.emplace(device_.type(), c10::EventFlag::BACKEND_DEFAULT);  // with timing
    slot->record(c10::impl::VirtualGuardImpl(device_.type()).getStream(device_));
  }

  std::optional<int64_t> measureDifference(Event start, Event end) override {
    auto& a = events_.at(static_cast<size_t>(start));
    auto& b = events_.at(static_cast<size_t>(end));
    // Not recorded this iteration (no backward, or no_sync()).
    if (!a || !b || !a->was_marked_for_recording() || !b->was_marked_for_recording()) {
      return std::nullopt;
    }
    c10::DeviceGuard guard(device_);
    // Called at the next forward: the previous iteration's work is done.
    a->synchronize();
    b->synchronize();
    const double ms = a->elapsedTime(*b);
    if (ms < 0) return std::nullopt;
    return static_cast<int64_t>(ms * 1e6);
  }

 private:
  c10::Device device_;
  std::array<std::optional<c10::Event>, 5> events_;  // one per Timer::Event
};

using c10d::RegistererTimerRegistry;
using c10d::TimerRegistry;
C10_REGISTER_TYPED_CLASS(TimerRegistry, runtime::kFlagos, FlagosTimer)

}  // namespace

}  // namespace torch_fl::distributed
