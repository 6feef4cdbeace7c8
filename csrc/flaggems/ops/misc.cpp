// Small kernels: zero_ (ops/zeros.py), tril (ops/tril.py: the causal mask of
// scaled_dot_product_attention's math path) and nll_loss_forward
// (ops/nllloss.py, the mean reduction that cross-entropy uses).

#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

KernelSlot g_zeros{"flag_gems.ops.zeros", "zeros_kernel", {"output_ptr", "n_elements", "BLOCK_SIZE"}};
KernelSlot g_tril{"flag_gems.ops.tril", "_tril_kernel",
                  {"in_ptr", "out_ptr", "M", "N", "B", "diag", "BLOCK_M", "BLOCK_N"}};
KernelSlot g_nll_fwd{"flag_gems.ops.nllloss", "nll_loss_forward_kernel",
                     {"inp_ptr", "tgt_ptr", "wgt_ptr", "out_ptr", "ignore_index", "N", "C",
                      "reduction", "BLOCK_N"}};

}  // namespace

// zero_(self): zeros_kernel over numel() elements of a flat buffer.
Outcome plan_fill_zero(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  if (!self || !self->is_contiguous() || elem_type(self->scalar_type()) == abi::TType::kInvalid) {
    return Outcome::kDecline;  // FlagGems' kernel writes numel() contiguous elements
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_zeros, plan, &o);
  if (!fn) return o;
  const int64_t n = self->numel();
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(n, 1024));
  L.ptr(*self);
  L.i(n);
  L.i(1024);
  plan.results.push_back(call.arg(0));
  return Outcome::kPlanned;
}

// tril(self, diagonal): the wrapper makes self contiguous, and one program
// masks a 32x32 tile of one [M, N] matrix of the batch (num_warps 4).
Outcome plan_tril(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  int64_t diagonal = 0;
  if (!self || self->dim() < 2 || self->numel() == 0 ||
      elem_type(self->scalar_type()) == abi::TType::kInvalid ||
      !int_arg(call.arg(1), &diagonal)) {
    return Outcome::kDecline;  // the wrapper asserts on 1-d input and skips empty ones
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_tril, plan, &o);
  if (!fn) return o;
  at::Tensor inp = call.contiguous(*self, plan);
  at::Tensor out = call.empty_like(inp, inp.scalar_type());
  const int64_t M = inp.size(-2), N = inp.size(-1), B = inp.numel() / (M * N);
  constexpr int64_t kBlock = 32;
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(M, kBlock));
  L.grid[1] = static_cast<uint32_t>(cdiv(N, kBlock));
  L.grid[2] = static_cast<uint32_t>(B);
  L.num_warps = 4;
  L.ptr(inp);
  L.ptr(out);
  L.i(M);
  L.i(N);
  L.i(B);
  L.i(diagonal);
  L.i(kBlock);
  L.i(kBlock);
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// nll_loss_forward(self, target, weight, reduction, ignore_index) for
// reduction=mean, no weight, float32: float32 [sum, weight, count, mean]
// accumulated with atomics; output = out[3], total_weight = out[1].
Outcome plan_nll_loss(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  const at::Tensor* target = call.tensor(1);
  int64_t reduction = 0, ignore_index = 0;
  if (!self || !target || self->scalar_type() != c10::kFloat || self->dim() > 2 ||
      !call.arg(2).isNone() || !int_arg(call.arg(3), &reduction) || reduction != 1 ||
      !int_arg(call.arg(4), &ignore_index) ||
      (target->scalar_type() != c10::kLong && target->scalar_type() != c10::kInt)) {
    return Outcome::kDecline;  // other reductions, weights, dtypes: not planned here
  }
  const int64_t N = self->dim() == 1 ? 1 : self->size(0);
  const int64_t C = self->size(-1);
  if (target->numel() != N) return Outcome::kDecline;
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_nll_fwd, plan, &o);
  if (!fn) return o;
  at::Tensor inp = call.contiguous(*self, plan);
  at::Tensor tgt = call.contiguous(*target, plan);
  at::Tensor out = call.zeros({4}, c10::kFloat);
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(N, 128));
  L.ptr(inp);
  L.ptr(tgt);
  L.none();
  L.ptr(out);
  L.i(ignore_index);
  L.i(N);
  L.i(C);
  L.i(reduction);
  L.i(128);
  plan.results.push_back(view_of(out, {}, {}, 3));
  plan.results.push_back(view_of(out, {}, {}, 1));
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
