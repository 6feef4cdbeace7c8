#pragma once

// Shared helpers of the family planners, and the planners the op table uses.

#include <cstdint>

#include "flaggems/ops/heuristics.h"
#include "flaggems/plan.h"

namespace torch_fl::flaggems::ops {

using heur::cdiv;
using heur::next_pow2;

// The JIT function of `slot`; when it is not exported yet, records the
// request in `plan` and sets *o to kNeedExport (kDecline when it failed).
inline const JitFn* need(KernelSlot& slot, CallPlan& plan, Outcome* o) {
  if (const JitFn* fn = slot.get()) return fn;
  if (slot.state.load(std::memory_order_acquire) == SlotState::kFailed) {
    *o = Outcome::kDecline;
  } else {
    plan.need_slot = &slot;
    *o = Outcome::kNeedExport;
  }
  return nullptr;
}

// A Scalar argument as Python receives it (int, float, bool); false for
// anything else (complex, a tensor, None).
inline bool scalar_value(const c10::IValue& v, abi::Value* out) {
  if (v.isDouble()) {
    *out = abi::Value::floating(v.toDouble());
  } else if (v.isBool()) {
    *out = abi::Value::boolean(v.toBool());
  } else if (v.isInt()) {
    *out = abi::Value::integer(v.toInt());
  } else {
    return false;
  }
  return true;
}

// Floating dtypes the reduction / softmax / matmul planners serve.
inline bool is_float(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kHalf || t == c10::kBFloat16;
}

// Product of sizes[begin, end).
inline int64_t prod(c10::IntArrayRef sizes, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= sizes[i];
  return p;
}

// An int argument (dim, keepdim as int, ...).
inline bool int_arg(const c10::IValue& v, int64_t* out) {
  if (!v.isInt()) return false;
  *out = v.toInt();
  return true;
}

// Normalises `dim` for a tensor of rank `ndim`; false when out of range.
inline bool wrap_dim(int64_t dim, int64_t ndim, int64_t* out) {
  if (dim < -ndim || dim >= ndim) return false;
  *out = dim < 0 ? dim + ndim : dim;
  return true;
}

// A tensor seen as [M, N, K] around `dim`: M the product of the sizes before
// it, N its size, K the product of the sizes after it (the view FlagGems'
// reduction and softmax wrappers take).
struct AroundDim {
  int64_t M, N, K;
};
inline AroundDim around_dim(const at::Tensor& t, int64_t dim) {
  const int64_t N = t.size(dim);
  const int64_t M = prod(t.sizes(), 0, static_cast<size_t>(dim));
  return {M, N, t.numel() / M / N};
}

// The "inner" kernel of a row reduction (softmax, mean, argmax with K == 1):
// one program per row, the row in tiles; writes TILE_N, ONE_TILE_PER_CTA,
// the grid and the warps.
inline void inner_row_tiles(Launch& L, int64_t M, int64_t N) {
  const int64_t tn = heur::tile_n_inner(N);
  L.i(tn);
  L.b(tn >= N);
  L.grid[0] = static_cast<uint32_t>(M);
  L.num_warps = heur::warps_by_tile(tn);
}

// The warps and stages of an autotuned kernel's config.
inline void use_config(Launch& L, const TunedConfig& cfg) {
  L.num_warps = cfg.num_warps;
  L.num_stages = cfg.num_stages;
}

// ---- planners (one per family) ---------------------------------------------
Outcome plan_pointwise(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_fill_zero(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_reduce_dim(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_all_dim(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_whole_reduce(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_cumsum(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_softmax(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_cat(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_index_select(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_embedding_backward(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_nll_loss(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_tril(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_bmm(const OpDesc& op, Call& call, CallPlan& plan);
Outcome plan_addmm(const OpDesc& op, Call& call, CallPlan& plan);

// ---- family descriptions the op table refers to ----------------------------

// A pointwise op: FlagGems' PointwiseDynamicFunction and which aten argument
// feeds each of its positional arguments.
struct PointwiseOp {
  PointwiseSlot* fn;
  PointwiseSlot* alt = nullptr;  // lerp: the kernel for weight >= 0.5
  int8_t args[4] = {-1, -1, -1, -1};
  int8_t nargs = 0;
  bool inplace = false;    // out0 = self (aten argument 0)
  bool where = false;      // where.self: out = torch.empty(broadcast shape), then out0=out
  bool masked = false;     // masked_fill_: aten argument 1 is the mask (bool only)
  // neg: ATen refuses a bool input, FlagGems' kernel computes one; the native
  // kernel serves such a call, and raises ATen's error.
  bool refuses_bool = false;
};

// A reduction of a whole tensor to a 0-d result in two kernels (all, max): per-
// block partial results of sqrt(n) elements, then their reduction.
struct WholeReduce {
  KernelSlot* first;
  KernelSlot* second;
  bool passes_mid_size;  // all_kernel_1 takes mid_size; max_kernel_1 does not
  bool bool_result;      // all: bool partials and result; max: the input's dtype
};

enum class Reduce : uint8_t { kMean, kArgmax };
enum class Softmax : uint8_t { kForward, kBackward, kLogForward, kLogBackward };

}  // namespace torch_fl::flaggems::ops
