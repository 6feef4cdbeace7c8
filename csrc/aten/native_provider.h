#pragma once

// The `native` provider: runs an operator with the driver's own kernels
// (PyTorch's CPU kernels on the host driver) over zero-copy native views of
// the flagos arguments, then maps the results back to flagos tensors. In-place
// and out= arguments come back as the same flagos tensors (with any resize
// carried over), views as flagos tensors on the argument's storage, fresh
// results as flagos memory with no copy.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

void run_native(const c10::OperatorHandle& op, const OpPlan& plan,
                torch::jit::Stack* stack);

// run_native for a call with a nested or sparse flagos tensor (`keys` holds
// NestedTensorPrivateUse1, SparsePrivateUse1 or SparseCsrPrivateUse1): such
// arguments become
// tensors of that layout on the native device over their components' native
// views, and the native device's kernel for the layout runs.
void run_native_layout(const c10::OperatorHandle& op, const OpPlan& plan,
                       c10::DispatchKeySet keys, torch::jit::Stack* stack);

// The `flaggems` provider: the operator's Python kernel (registered by the
// Python layer, see python_provider.h) runs on native views, exactly like a
// native kernel would, so it sees CUDA tensors on the current CUDA stream.
// `kernel`: the Python kernel to call; -1 means the plan's. If the kernel
// raises, the stack holds the call's arguments again, as it found them.
void run_python(const c10::OperatorHandle& op, const OpPlan& plan,
                torch::jit::Stack* stack, int64_t kernel = -1);

// The `cpu` provider for drivers whose memory is not host memory: arguments
// are copied to the CPU, PyTorch's CPU kernel runs, written arguments are
// copied back (resized if the kernel resized them) and results are copied to
// the device. Results that alias an argument come back as copies: aliasing
// cannot survive a round trip. Random kernels draw from CPU's generator.
void run_cpu_copy(const c10::OperatorHandle& op, const OpPlan& plan,
                  torch::jit::Stack* stack);

}  // namespace torch_fl::aten
