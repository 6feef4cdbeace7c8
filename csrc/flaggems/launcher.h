#pragma once

// FlagGems' Triton kernels launched from C++ (docs/flaggems_cpp.md).
//
// A flaggems-routed call of an operator with a C++ description (ops.cpp) is
// planned by its family planner: outputs allocated as flagos tensors, grid,
// warps and every kernel argument computed from tensor metadata as FlagGems'
// Python wrapper computes them. The plan's kernel key (Triton's
// specialization, triton_abi.h) selects a compiled kernel from a lock-free
// table, launched with cuLaunchKernelEx on the current stream: no Python, no
// strings, no locks.
//
// The first call of a kernel key takes the slow path instead: FlagGems'
// wrapper runs as before, with Triton's launch hook recording what it
// launched; when that equals the plan (kernel, grid, warps, every argument,
// the results' geometry), the compiled kernel is admitted (memory and disk);
// when not, the key stays on the wrapper (counted, warned once). Autotuned
// kernels take FlagGems' choice from the same capture, per tuner key.
// Stub-only mode (FLAGOS_DISABLE_FLAGGEMS_PY=1) has no wrapper: a miss
// compiles the planned specialization from FlagGems' sources instead.

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl::aten {
struct OpPlan;
}

namespace torch_fl::flaggems {

struct OpDesc;

// Installs the descriptions of `ops` (aten names FlagGems serves here, after
// torch_fl's exclusions), for Triton `triton_version`. Called once by
// torch_fl/_flaggems_cpp.py. Throws when Triton is not the version
// triton_abi.h implements and `stub_only` (nothing else could serve them);
// otherwise warns and leaves the C++ path off.
void install(const std::vector<std::string>& ops, const std::string& triton_version,
             bool stub_only);
bool installed() noexcept;

// FLAGOS_FLAGGEMS_CPP (default on) and its runtime switch (tests compare both
// paths in one process).
bool cpp_enabled() noexcept;
void set_cpp_enabled(bool on) noexcept;

// The description of `op` when the C++ path can serve it; nullptr otherwise.
const OpDesc* describe(const c10::OperatorHandle& op);
// The aten names with an installed description.
std::vector<std::string> described_ops();

enum class Ran : uint8_t {
  kCpp,        // launched from C++
  kPython,     // FlagGems' Python wrapper ran (first call of a key, a pinned key)
  kNotServed,  // neither: the caller runs the wrapper (or native, stub-only)
  kNative,     // FlagGems fails on these arguments (Outcome::kNative): the caller runs native
};

// Runs `op`, described by `d` (describe(op)), with the arguments on `stack`.
// `python_kernel`: FlagGems' wrapper a capture runs (-1: the plan's).
Ran run(const c10::OperatorHandle& op, const aten::OpPlan& plan, const OpDesc& d,
        int64_t python_kernel, torch::jit::Stack* stack);

// Counters for torch_fl.flaggems.cpp_stats(): global ones, and per op
// (launched, captured, declined).
std::vector<std::pair<std::string, uint64_t>> stats();
std::vector<std::pair<std::string, std::vector<uint64_t>>> op_stats();
// Keys pinned to Python, with the reason (first mismatching field).
std::vector<std::string> pinned();

// ---- offline checks (tests/python/test_flaggems_cpp_offline.py) ------------
// Plans `aten_op` on `args` (flagos tensors) and returns the plan as text
// lines plus structured launches; no launch, no capture.
struct PlannedLaunch {
  int fn_id;
  std::string fn_ref;
  uint32_t grid[3];
  int num_warps, num_stages;
  std::vector<std::string> names;
  std::vector<std::string> specs;      // Triton's specialization as text
  std::vector<std::string> values;     // argument values as text
};
struct PlanReport {
  std::string outcome;                 // "planned", "decline", "need-tuning", ...
  std::vector<PlannedLaunch> launches;
  std::vector<std::string> results;    // sizes/strides/dtype of each result
};
PlanReport plan_only(const std::string& aten_op, std::vector<c10::IValue> args);

// Compares `aten_op`'s plan on `args` with a capture of FlagGems' wrapper on
// the same arguments (taken by `run_wrapper`, which calls it between
// capture_begin and capture_end and returns its results): "" when they
// match, else the first difference. Learns autotuned configs like the online
// path does.
std::string check_against_capture(const std::string& aten_op, std::vector<c10::IValue> args,
                                  const std::function<std::vector<c10::IValue>()>& run_wrapper);

// Compiles every kernel of `aten_op`'s plan on `args` from FlagGems' sources
// (as stub-only mode does) and returns Triton's hash of each, or throws; also
// checks that each PTX entry takes exactly the parameters pack() fills.
std::vector<std::string> compile_plan(const std::string& aten_op, std::vector<c10::IValue> args);

}  // namespace torch_fl::flaggems
