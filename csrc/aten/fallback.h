#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

// Registers the boxed routing kernel directly for the structured operators
// whose native kernels can run them without decomposition (see fallback.cpp).
// Called once, after every static registration of the library has run.
void register_direct_routes();

// The boxed routing kernel: every operator without a kernel of its own
// reaches it (it is the PrivateUse1 fallback), and unboxed routes hand it the
// calls they do not serve themselves.
void boxed_routing_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                          torch::jit::Stack* stack);
// Its body, for a caller that holds the operator's plan (plan_for(op)).
// The fallback for calls with a nested or sparse flagos tensor
// (NestedTensorPrivateUse1, SparsePrivateUse1, SparseCsrPrivateUse1): counted as the operator's route
// says, run by the native device's kernels for that layout (run_native_layout)
// whatever the route, but for the cuda driver's 'cpu' route, which is refused.
void layout_routing_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack);
// Registers layout_routing_kernel for every aten operator with a kernel for the
// native device's nested or sparse tensors; once, at import.
void register_layout_routes();
void route_planned(const c10::OperatorHandle& op, OpPlan& plan, torch::jit::Stack* stack);

// Registers the unboxed routes (unboxed_routes.cpp) for the operators the
// active driver's native device has kernels for. Called once, with the
// driver selected, before register_direct_routes().
void register_unboxed_routes();

// What served a call: its backend (flaggems calls that neither C++ nor a
// wrapper can serve run on native), and whether FlagGems' kernel was
// launched from C++.
struct Served {
  routing::Backend backend;
  bool flaggems_cpp;
};

// Runs a call on `backend`'s provider, with no routing, counting or
// observing: what the boxed routing kernel does last, and what verification
// and tuning use to run a call on a backend of their choice.
// `python_kernel`: FlagGems' wrapper to call (-1: the plan's);
// `flaggems_desc`: the operator's C++ description (flaggems::describe), or
// nullptr for the wrapper only.
Served run_provider(const c10::OperatorHandle& op, const OpPlan& plan, routing::Backend backend,
                    torch::jit::Stack* stack, int64_t python_kernel = -1,
                    const void* flaggems_desc = nullptr);

// Whether FlagGems cannot serve this call's arguments (0-dim, empty or complex
// tensors, an explicit generator), so that a flaggems route runs it on
// `native`. `stack` ends with the call's arguments.
bool flaggems_declines(const OpPlan& plan, const torch::jit::Stack& stack);

// Runs `op` through the routing path, as if it had reached the fallback.
void route_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_fl::aten
