#pragma once

// Call observers: code that sees every routed call on the boxed path, for
// shadow verification (shadow_verify.h), tuning (tune_recorder.h) and
// profiling (host time per operator and backend, for FLAGOS_REPORT).
//
// The boxed routing kernel checks observing(), one relaxed atomic load, and
// only when some observer is on hands the call to observe_call(), which
// runs it on its backend as the kernel would have, plus whatever the active
// observers need. While any observer is on, routing::boxed_only() is true,
// so unboxed routes hand every call to the boxed kernel and none is missed.
//
// Observers never run on their own calls: the calls they make (reference
// kernels, timing runs) are below the routing path, and a routed call made
// while an observer works on this thread just runs.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/fallback.h"
#include "aten/op_plan.h"
#include "routing/table.h"

namespace torch_fl::aten {

// Bits of routing's every-call word (routing/table.h), beside its log bit.
enum ObserverBit : uint32_t {
  kObserveVerify = 1u << 1,
  kObserveTune = 1u << 2,
  kObserveProfile = 1u << 3,
};
inline constexpr uint32_t kObserverBits = kObserveVerify | kObserveTune | kObserveProfile;

// Hot path: whether any observer is on (one load of a hidden word).
inline bool observing() noexcept {
  return (routing::detail::g_every_call.load(std::memory_order_relaxed) & kObserverBits) != 0;
}

// Turns an observer on or off (idempotent).
void set_observer(ObserverBit bit, bool on);
bool observer_on(ObserverBit bit) noexcept;

// Runs a routed call on `backend`, with the active observers around it;
// returns what served it (run_provider).
Served observe_call(const c10::OperatorHandle& op, const OpPlan& plan, routing::Backend backend,
                    torch::jit::Stack* stack, const void* flaggems_desc);

// ---- profiling -----------------------------------------------------------------
// Host wall time of each routed call's provider, per operator and backend
// (on GPU drivers: the time to issue the work, not to run it).
struct ProfileRecord {
  std::string op;
  std::string backend;
  uint64_t calls;
  double host_us;  // total
};
std::vector<ProfileRecord> profile_records();

}  // namespace torch_fl::aten
