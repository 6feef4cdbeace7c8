#pragma once

// What the boxed path needs to know about an operator, worked out once from
// its schema and then found by the operator's identity (the address of its
// schema, stable for the process): no string is built or compared per call.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

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
  uint16_t num_arguments;
  uint16_t num_returns;
  // Only the arguments the boxed path has to translate, in order.
  c10::SmallVector<ArgSlot, 6> slots;
};

// The plan of `op`, built on first use. Thread-safe; lock-free after the first
// call from a thread.
const OpPlan& plan_for(const c10::OperatorHandle& op);

}  // namespace torch_fl::aten
