#pragma once

// What the boxed path needs to know about an operator, worked out once from
// its schema and then found by the operator's identity (the address of its
// schema, stable for the process): no string is built or compared per call.

#include <array>
#include <atomic>
#include <string>
#include <string_view>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include "routing/config.h"
#include "aten/host_parity.h"

namespace torch_fl::aten {

enum class ArgKind : uint8_t {
  kTensor,              // Tensor, Tensor?
  kTensorList,          // Tensor[]
  kOptionalTensorList,  // Tensor?[]
  kDevice,              // Device, Device?
  kGenerator,           // Generator?
};

struct ArgSlot {
  uint16_t index;  // position among the operator's arguments
  ArgKind kind;
  bool is_write;   // annotated (a!): the kernel may write or resize it
};

struct OpPlan {
  const c10::FunctionSchema* schema;
  std::string name;  // "aten::add.Tensor"
  uint16_t num_arguments;
  uint16_t num_returns;
  // Only the arguments the boxed path has to translate, in order.
  c10::SmallVector<ArgSlot, 6> slots;

  // ---- routing (routing/table.h) ----------------------------------------
  // The routing epoch `backend` was resolved in; 0: not yet. A routing change
  // bumps the global epoch, so every plan re-resolves on its next call.
  std::atomic<uint32_t> route_epoch{0};
  std::atomic<routing::Backend> backend{routing::Backend::kNative};
  // True when no backend of the route can serve the op and it runs on the
  // CPU instead (FLAGOS_CPU_FALLBACK decides whether that is allowed).
  std::atomic<bool> cpu_fallback{false};
  // True when the route runs the driver's own kernels over zero-copy views
  // (native, cuda, or cpu on the host driver) with no CPU fallback: what an
  // unboxed route (unboxed_route.h) may serve itself.
  std::atomic<bool> native_route{false};
  // The host driver's own kernel where the CPU's is not it (host_parity.h);
  // nullptr for almost every operator, and for all on other drivers.
  HostKernel host_kernel = nullptr;
  std::array<std::atomic<uint64_t>, routing::kNumBackends> calls{};
  std::atomic<uint64_t> fallback_calls{0};
  std::atomic<uint8_t> logged{0};  // bit per backend: dispatch log written
  // The Python kernel serving the op when routed to flaggems; -1: none.
  std::atomic<int64_t> python_kernel{-1};
  // FlagGems' kernels launched from C++ (csrc/flaggems/launcher.h): the op's
  // description when routed to flaggems (nullptr: none), and how many of the
  // flaggems calls in `calls` it launched (the rest ran FlagGems' Python).
  std::atomic<const void*> flaggems_op{nullptr};
  std::atomic<uint64_t> flaggems_cpp_calls{0};
};

// The operator's name as routing, configs and registrations write it:
// "add.Tensor", "mm", "ns::op.overload" (the "aten::" prefix dropped).
std::string op_key(const c10::OperatorName& name);

// The inverse of op_key for aten operators: "add.Tensor" (or
// "aten::add.Tensor") -> {"aten::add", "Tensor"}.
c10::OperatorName aten_operator_name(std::string_view key);

// The plan of `op`, built on first use. Thread-safe; lock-free after the first
// call from a thread.
OpPlan& plan_for(const c10::OperatorHandle& op);

// Calls `f` on every plan built so far (for statistics and tables).
void for_each_plan(const std::function<void(OpPlan&)>& f);

}  // namespace torch_fl::aten
