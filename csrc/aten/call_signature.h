#pragma once

// The signature of one operator call, as text: what tuning groups calls by
// and what verification names a failing call by.
//
//   mm(f32[64, 128], f32[128, 32]{1, 128})
//   add.Tensor(bf16[2, 8, 64], bf16[64], alpha=1)
//   _softmax(f32[4, 8], dim=-1, half_to_float=False)
//
// Tensors are written dtype[sizes], with {strides} when not contiguous (the
// storage offset is left out: it varies from call to call without changing
// the work); other arguments by name and value. Long tensor lists (a
// _foreach op over every parameter) are summarised by count, dtypes and
// total elements.

#include <string>

#include <ATen/core/ivalue.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

// `args` points at the call's plan.num_arguments arguments.
std::string call_signature(const OpPlan& plan, const c10::IValue* args);

}  // namespace torch_fl::aten
