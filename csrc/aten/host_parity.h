#pragma once

// The host driver's native kernels are PyTorch's CPU kernels. A few operators
// accept inputs on CUDA that their CPU kernel refuses, and programs pick those
// inputs for every device that is not the CPU: Hugging Face's MoE layers count
// tokens per expert with an integer histc unless the device is "cpu" or "mps".
// For such an operator the host driver's native kernel is written here. It
// runs on the native (CPU) views where the native provider would run the CPU
// kernel, so routing, statistics and the dispatch log are unchanged; it
// computes what CUDA's kernel computes for the inputs the CPU kernel refuses,
// and hands every other call to the CPU kernel. Operators the CPU has no
// kernel for at all (SyncBatchNorm's) get one here as well.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace torch_fl::aten {

using HostKernel = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The host driver's own kernel for `op`, or nullptr when the CPU kernel is it
// (always on other drivers).
HostKernel host_parity_kernel(const c10::OperatorHandle& op);

// A host kernel's `result` written into its .out variant's `out` (resized as
// out= operators resize, converted to out's dtype by copy_); returns `out`.
at::Tensor into_out(at::Tensor out, const at::Tensor& result);

}  // namespace torch_fl::aten
