#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

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

// Registers the unboxed routes (unboxed_routes.cpp) for the operators the
// active driver's native device has kernels for. Called once, with the
// driver selected, before register_direct_routes().
void register_unboxed_routes();

// Runs `op` through the routing path, as if it had reached the fallback.
void route_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_fl::aten
