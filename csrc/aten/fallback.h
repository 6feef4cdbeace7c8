#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl::aten {

// Registers the boxed routing kernel directly for the structured operators
// whose native kernels can run them without decomposition (see fallback.cpp).
// Called once, after every static registration of the library has run.
void register_direct_routes();

// Runs `op` through the routing path, as if it had reached the fallback.
void route_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torch_fl::aten
