#pragma once

// Providers whose kernels are Python callables: FlagGems' Triton operators
// (the `flaggems` backend). libtorch_fl has no Python dependency, so the
// Python binding installs the function that calls a kernel (it takes the GIL
// and converts arguments and results); this file keeps the table of which
// operator has which kernel. Kernels are registered before routing resolves
// (torch_fl.flaggems, at import) and read-only afterwards.

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl::aten {

// Calls Python kernel `kernel` with the operator's arguments on the stack and
// leaves its results there, as a boxed kernel does.
using PythonInvoker = void (*)(int64_t kernel, const c10::OperatorHandle& op,
                               torch::jit::Stack* stack);

void set_python_invoker(PythonInvoker invoker);

// Registers `kernel` for aten operator `op_name` ("add.Tensor", "mm"); false
// when no such operator exists. Re-registering replaces.
bool register_python_kernel(const std::string& op_name, int64_t kernel);
void clear_python_kernels();
// The operators that have a kernel, as registered.
std::vector<std::string> python_kernel_ops();

// The kernel for `op`, if any (looked up once per operator, at routing).
std::optional<int64_t> python_kernel_for(const c10::OperatorHandle& op);
bool has_python_kernels();

void invoke_python_kernel(int64_t kernel, const c10::OperatorHandle& op,
                          torch::jit::Stack* stack);

}  // namespace torch_fl::aten
