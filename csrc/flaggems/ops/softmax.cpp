// The softmax family: _softmax, _softmax_backward_data, _log_softmax and
// _log_softmax_backward_data (ops/softmax.py, ops/log_softmax.py). The input
// is seen as [M, N, K] around `dim`; K > 1 takes the "non-inner" kernels. The
// backward kernels are autotuned (triton.autotune, keys M, N[, K] and the
// dtypes): FlagGems' choice is learned per tuner key from a capture.

#include "flaggems/cuda_launch.h"
#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

KernelSlot g_fwd_non_inner{"flag_gems.ops.softmax", "softmax_kernel_non_inner",
                           {"output_ptr", "input_ptr", "M", "N", "K", "TILE_N", "TILE_K",
                            "ONE_TILE_PER_CTA"}};
KernelSlot g_fwd_inner{"flag_gems.ops.softmax", "softmax_kernel_inner",
                       {"output_ptr", "input_ptr", "M", "N", "TILE_N", "ONE_TILE_PER_CTA"}};
KernelSlot g_bwd_non_inner{"flag_gems.ops.softmax", "softmax_backward_kernel_non_inner",
                           {"out_ptr", "out_grad_ptr", "in_grad_ptr", "M", "N", "K", "TILE_N",
                            "TILE_K", "ONE_TILE_PER_CTA"}};
KernelSlot g_bwd_inner{"flag_gems.ops.softmax", "softmax_backward_kernel_inner",
                       {"out_ptr", "out_grad_ptr", "in_grad_ptr", "M", "N", "TILE_M", "TILE_N",
                        "ONE_TILE_PER_CTA"}};
KernelSlot g_log_fwd{"flag_gems.ops.log_softmax", "log_softmax_kernel",
                     {"output_ptr", "input_ptr", "M", "N", "K", "BLOCK_M", "BLOCK_N"}};
KernelSlot g_log_bwd{"flag_gems.ops.log_softmax", "log_softmax_backward_kernel",
                     {"out_ptr", "out_grad_ptr", "in_grad_ptr", "M", "N", "K", "BLOCK_M",
                      "BLOCK_N"}};
TunerSlot g_tune_bwd_non_inner{&g_bwd_non_inner, {"TILE_K"}};
TunerSlot g_tune_bwd_inner{&g_bwd_inner, {"TILE_N"}};
TunerSlot g_tune_log_bwd{&g_log_bwd, {"BLOCK_M", "BLOCK_N"}};

using heur::warps_by_tile;

}  // namespace

Outcome plan_softmax(const OpDesc& op, Call& call, CallPlan& plan) {
  const Softmax kind = *static_cast<const Softmax*>(op.family);
  const bool forward = kind == Softmax::kForward || kind == Softmax::kLogForward;
  const bool log = kind == Softmax::kLogForward || kind == Softmax::kLogBackward;
  // forward (self, dim, half_to_float); backward (grad_output, output, dim, input_dtype)
  const at::Tensor* x = call.tensor(forward ? 0 : 1);
  const at::Tensor* grad = forward ? nullptr : call.tensor(0);
  if (!x || !is_float(x->scalar_type()) || (!forward && (!grad || !is_float(grad->scalar_type())))) {
    return Outcome::kDecline;
  }
  int64_t dim = 0;
  if (!int_arg(call.arg(forward ? 1 : 2), &dim) || !wrap_dim(dim, x->dim(), &dim)) {
    return Outcome::kDecline;
  }
  c10::ScalarType out_dtype;
  if (forward) {
    if (!call.arg(2).isBool()) return Outcome::kDecline;
    out_dtype = call.arg(2).toBool() ? c10::kFloat : x->scalar_type();
  } else {
    if (!call.arg(3).isInt()) return Outcome::kDecline;
    out_dtype = static_cast<c10::ScalarType>(call.arg(3).toInt());
    if (!is_float(out_dtype)) return Outcome::kDecline;
    // FlagGems reads `output` as contiguous without making it so, and
    // empty_like(output) keeps its strides: served only when contiguous.
    if (!x->is_contiguous()) return Outcome::kDecline;
  }
  const auto [M, N, K] = around_dim(*x, dim);

  Outcome o = Outcome::kPlanned;
  const JitFn* fn;
  if (log) {
    fn = need(forward ? g_log_fwd : g_log_bwd, plan, &o);
  } else if (forward) {
    fn = need(K > 1 ? g_fwd_non_inner : g_fwd_inner, plan, &o);
  } else {
    fn = need(K > 1 ? g_bwd_non_inner : g_bwd_inner, plan, &o);
  }
  if (!fn) return o;

  // Autotuned kernels: the config FlagGems chose for this tuner key
  // (triton.autotune's key: the key arguments, then every tensor's dtype).
  const TunedConfig* cfg = nullptr;
  if (!forward) {
    int64_t key[6];
    int n = 0;
    key[n++] = M;
    key[n++] = N;
    if (!log && K > 1) key[n++] = K;
    key[n++] = static_cast<int64_t>(x->scalar_type());
    key[n++] = static_cast<int64_t>(grad->scalar_type());
    key[n++] = static_cast<int64_t>(out_dtype);
    TunerSlot& tuner = log ? g_tune_log_bwd : K > 1 ? g_tune_bwd_non_inner : g_tune_bwd_inner;
    cfg = call.tuned(tuner, key, n, plan);
    if (!cfg) return Outcome::kNeedTuning;
  }

  Launch& L = plan.add_launch();
  L.start(fn);
  at::Tensor out;
  if (forward) {
    at::Tensor inp = call.contiguous(*x, plan);
    out = call.empty_like(inp, out_dtype);
    L.ptr(out);
    L.ptr(inp);
  } else {
    at::Tensor g = call.contiguous(*grad, plan);
    out = call.empty_like(*x, out_dtype);
    L.ptr(*x);
    L.ptr(g);
    L.ptr(out);
  }
  L.i(M);
  L.i(N);
  if (log) {
    L.i(K);
    const int64_t bm = forward ? 8 : cfg->values[0];
    const int64_t bn = forward ? 256 : cfg->values[1];
    L.i(bm);
    L.i(bn);
    L.grid[0] = static_cast<uint32_t>(cdiv(M, bm));
    L.grid[1] = static_cast<uint32_t>(K);
    if (forward) {
      L.num_warps = 8;
    } else {
      use_config(L, *cfg);
    }
  } else if (K > 1) {
    // Tiles: forward from FlagGems' heuristics, backward from its tuned config.
    const int64_t tk = forward ? heur::softmax_tile_k(M, K, cuda::sm_count(call.device()))
                               : cfg->values[0];
    const int64_t tn = forward ? cdiv(8192, tk) : std::max<int64_t>(1, 1024 / tk);
    L.i(K);
    L.i(tn);
    L.i(tk);
    L.b(tn >= N);
    L.grid[0] = static_cast<uint32_t>(M);
    L.grid[1] = static_cast<uint32_t>(cdiv(K, tk));
    if (forward) {
      L.num_warps = warps_by_tile(tn * tk);
    } else {
      use_config(L, *cfg);
    }
  } else if (forward) {
    inner_row_tiles(L, M, N);
  } else {
    const int64_t tn = cfg->values[0];
    const int64_t tm = std::max<int64_t>(1, 1024 / tn);
    L.i(tm);
    L.i(tn);
    L.b(tn >= N);
    L.grid[0] = static_cast<uint32_t>(cdiv(M, tm));
    use_config(L, *cfg);
  }
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
