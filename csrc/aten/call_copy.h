#pragma once

// Copies of one operator call's arguments, for observers that run a call
// again (shadow verification, tuning) without touching the workload's
// tensors. A copy is made below the routing path (allocator and driver
// copies only), so nothing is routed or counted.

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

// Where the copies of flagos tensors live.
enum class CopyTarget {
  kFlagos,  // flagos tensors: any backend's provider can run on them
  kNative,  // tensors of the native device (CPU on the host driver, CUDA on
            // the cuda driver): the reference kernels run on them directly
};

// The call's arguments (`args[0 .. plan.num_arguments)`), with every flagos
// tensor copied: sizes, strides, offsets and conj/neg bits are kept, and
// tensors that share a storage get copies that share one new storage, so
// aliasing (an in-place op whose inputs overlap, out= one of the inputs) is
// kept too. Tensors of other devices (a CPU scalar) are shared, unless the
// schema marks them as written: those are cloned on their device. For
// kNative, flagos Device arguments become the native device.
std::vector<c10::IValue> copy_arguments(const OpPlan& plan, const c10::IValue* args,
                                        CopyTarget target);

// The tensors the schema marks as written (`(a!)`), in argument order
// (elements of written tensor lists included).
std::vector<at::Tensor> written_tensors(const OpPlan& plan, const c10::IValue* args);

// Names for written_tensors(), in the same order: "argument 'out'",
// "argument 'self'[2]" for an element of a list.
std::vector<std::string> written_labels(const OpPlan& plan, const c10::IValue* args);

// The bytes of flagos memory the call's tensor arguments span (what a copy
// of its arguments costs).
size_t argument_bytes(const OpPlan& plan, const c10::IValue* args);

// The flagos device of the call: its first flagos tensor's or Device
// argument's, else the current device.
c10::DeviceIndex call_device(const OpPlan& plan, const c10::IValue* args);

// Whether this call draws random numbers (the operator has a Generator
// argument, or the nondeterministic_seeded tag): running it twice would move
// the workload's random stream, and its results cannot be compared with
// another kernel's. A tagged operator called with dropout_p=0 (attention
// kernels at inference) draws nothing.
bool is_random(const c10::OperatorHandle& op, const OpPlan& plan, const c10::IValue* args);

// For an operator with the nondeterministic_seeded tag called without drawing
// (dropout_p=0), integer tensor outputs are random-generator state (the philox
// seed and offset of attention kernels, left uninitialised then), not results:
// they become None, so comparisons skip them.
void drop_rng_state(const c10::OperatorHandle& op, std::vector<c10::IValue>& outputs);

// An exception's message, without a c10::Error's backtrace.
std::string error_text(const std::exception& e);

// Why this call must not be run a second time ("" if it may): not an aten
// operator (it may be a collective), a random operator, or a call made during
// CUDA graph capture.
std::string rerun_skip_reason(const c10::OperatorHandle& op, const OpPlan& plan,
                              const c10::IValue* args);

// Labels of call_outputs(): "result i" for each return, then `written`
// (written_labels() of the call).
std::vector<std::string> output_labels(const OpPlan& plan,
                                       const std::vector<std::string>& written);

// What a finished call produced, to compare: its returns (the last
// plan.num_returns values of `stack`), then the tensors it wrote (`written`,
// written_tensors() of its arguments), after drop_rng_state().
std::vector<c10::IValue> call_outputs(const c10::OperatorHandle& op, const OpPlan& plan,
                                      const torch::jit::Stack& stack,
                                      const std::vector<at::Tensor>& written);

}  // namespace torch_fl::aten
