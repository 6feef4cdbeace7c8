#include "aten/call_observer.h"

#include <algorithm>
#include <chrono>
#include <tuple>
#include <map>
#include <mutex>
#include <optional>

#include "aten/fallback.h"
#include "aten/shadow_verify.h"
#include "aten/tune_recorder.h"
#include "routing/table.h"

namespace torch_fl::aten {

namespace {

// Calls an observer makes on this thread are not observed again.
thread_local int t_observing = 0;

struct Depth {
  Depth() { ++t_observing; }
  ~Depth() { --t_observing; }
};

struct Profile {
  std::mutex mu;
  // (plan, backend) -> (calls, host microseconds).
  std::map<std::pair<const OpPlan*, int>, std::pair<uint64_t, double>> by_op;
};

Profile& profile() {
  static auto* p = new Profile();  // leaked: written by kernels until exit
  return *p;
}

}  // namespace

void set_observer(ObserverBit bit, bool on) {
  // One word: unboxed routes defer to the boxed kernel in the same store that
  // turns the observer on, and serve calls again when the last one is off.
  routing::set_every_call_bits(bit, on);
}

bool observer_on(ObserverBit bit) noexcept {
  return (routing::detail::g_every_call.load(std::memory_order_relaxed) & bit) != 0;
}

Served observe_call(const c10::OperatorHandle& op, const OpPlan& plan, routing::Backend backend,
                    torch::jit::Stack* stack, const void* flaggems_desc) {
  const uint32_t on = routing::detail::g_every_call.load(std::memory_order_relaxed) & kObserverBits;
  if (t_observing > 0 || on == 0) {
    return run_provider(op, plan, backend, stack, -1, flaggems_desc);
  }
  Depth depth;
  const c10::IValue* args = stack->data() + (stack->size() - plan.num_arguments);
  // Before the call: what it reads may be what it writes.
  std::optional<ShadowCall> shadow;
  if (on & kObserveVerify) shadow.emplace(op, plan, backend, args);
  std::optional<TuneJob> job;
  if (on & kObserveTune) job = tune_note_call(op, plan, args);

  const auto t0 = std::chrono::steady_clock::now();
  const Served served = run_provider(op, plan, backend, stack, -1, flaggems_desc);
  if (on & kObserveProfile) {
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    auto& p = profile();
    std::lock_guard<std::mutex> lock(p.mu);
    auto& [calls, total] = p.by_op[{&plan, static_cast<int>(backend)}];
    ++calls;
    total += us;
  }
  if (job) tune_measure(op, plan, *job);
  if (shadow) shadow->check(op, *stack);  // may raise (FLAGOS_VERIFY=error): last
  return served;
}

std::vector<ProfileRecord> profile_records() {
  auto& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  std::vector<ProfileRecord> out;
  for (const auto& [key, value] : p.by_op) {
    out.push_back({key.first->name, std::string(routing::backend_name(static_cast<routing::Backend>(key.second))),
                   value.first, value.second});
  }
  std::sort(out.begin(), out.end(), [](const ProfileRecord& a, const ProfileRecord& b) {
    return std::tie(a.op, a.backend) < std::tie(b.op, b.backend);
  });
  return out;
}

}  // namespace torch_fl::aten
