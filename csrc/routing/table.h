#pragma once

// The routing table: which backend serves each operator, decided once per
// operator (and again only after a routing change) from, in order of
// precedence:
//   1. torch_fl.routing.set_route()            (source "api")
//   2. FLAGOS_OP_<name>, '.' written '__'      (source "env")
//   3. the config file                         (source "file")
//   4. the default: flaggems where it serves the op, else the driver's native
//      kernels                                 (source "default")
// Within each, an overload entry (add.Tensor) wins over its base (add). A
// chain takes its first backend that is available on this driver and serves
// the op; when none does, the op runs on the CPU as a counted fallback that
// FLAGOS_CPU_FALLBACK=warn|allow|error governs.

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

#include "aten/op_plan.h"
#include "routing/config.h"

namespace torch_fl::routing {

// Reads FLAGOS_BACKEND_CONFIG (else `default_path`, the packaged
// backends.conf), the FLAGOS_OP_* variables and the policy variables, checks
// every name against the dispatcher and the driver, and installs the result.
// Returns every problem found (one string each, with source and line); the
// caller raises them (FLAGOS_CONFIG_STRICT=1, the default) or warns. What was
// valid is installed either way.
std::vector<std::string> load(const std::string& default_path);

// Checks a config file alone, as `python -m torch_fl check-config` does.
std::vector<std::string> check_file(const std::string& path);

namespace detail {
// Read on the hot path with one PC-relative load each (hidden: never from
// outside libtorch_fl, so no PLT call and no interposition).
[[gnu::visibility("hidden")]] extern std::atomic<uint32_t> g_epoch;
// What needs every call on the boxed routing kernel: kLogBit (the dispatch
// log) and the call observers' bits (aten/call_observer.h).
[[gnu::visibility("hidden")]] extern std::atomic<uint32_t> g_every_call;
}  // namespace detail

inline constexpr uint32_t kLogBit = 1u << 0;

// The global routing epoch; a plan whose route_epoch differs re-resolves.
inline uint32_t epoch() noexcept { return detail::g_epoch.load(std::memory_order_relaxed); }

// Slow path: decides the route of `plan` and stores it (thread-safe).
void resolve(const c10::OperatorHandle& op, aten::OpPlan& plan);

// Routes `op` ("mm", "add.Tensor") through `chain` ("cuda" or "flaggems,
// cuda") from now on; an empty chain removes the override. Throws
// c10::ValueError for an unknown op or backend, or a chain with no backend
// available here.
void set_route(const std::string& op, const std::string& chain);

// The environment variable that routes `op` ("add.Tensor"): FLAGOS_OP_add__Tensor.
std::string env_var(std::string_view op);

struct Row {
  std::string op;       // "aten::add.Tensor", or a configured name
  std::string backend;  // chosen backend, or the configured chain if unresolved
  std::string source;   // "api", "env FLAGOS_OP_mm", "file PATH:LINE", "default"
  bool resolved;        // false: configured, not called yet
  bool cpu_fallback;
  // For ops resolved to flaggems: "c++" when FlagGems' kernels are launched
  // from C++ (csrc/flaggems), "python" when its Python wrappers run them.
  std::string via;
};
std::vector<Row> table();

// The stats key of flaggems calls that ran FlagGems' Python wrapper; those
// launched from C++ count under "flaggems".
inline constexpr const char* kFlagGemsPython = "flaggems-python";

struct Stat {
  std::string op;
  std::vector<std::pair<std::string, uint64_t>> calls;  // backend -> count
  uint64_t cpu_fallbacks;
};
std::vector<Stat> stats();
void reset_stats();

// Which backends this driver provides ("cpu, native" on the host driver).
std::vector<Backend> available_backends();
// Whether `b` is available here and has a kernel for `op`.
bool serves(Backend b, const c10::OperatorHandle& op);

// Dispatch-log and fallback-policy state, read on the hot path.
inline bool log_enabled() noexcept {
  return (detail::g_every_call.load(std::memory_order_relaxed) & kLogBit) != 0;
}
// True while every call must take the boxed routing kernel, where the
// dispatch log and call observers see it; unboxed routes then defer to it.
inline bool boxed_only() noexcept {
  return detail::g_every_call.load(std::memory_order_relaxed) != 0;
}
// Sets or clears `bits` of the word above; returns the word before.
uint32_t set_every_call_bits(uint32_t bits, bool on) noexcept;
void log_dispatch(const aten::OpPlan& plan, Backend backend);
enum class FallbackPolicy : uint8_t { kWarn, kAllow, kError };
FallbackPolicy fallback_policy() noexcept;
// The config file in force ("" when none).
std::string config_path();

}  // namespace torch_fl::routing
