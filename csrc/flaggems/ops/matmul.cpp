// Matrix products: bmm (ops/bmm.py) and addmm (ops/addmm.py). Both kernels are
// autotuned by FlagGems' LibTuner, whose key applies a strategy to each key
// argument ("log": the next power of two, "align32": rounded up to 32) and
// appends every tensor's dtype; the tiles come from FlagGems' choice for that
// key (captured once), the grid and bmm's DIVISIBLE_* heuristics from them.

#include <cmath>

#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

KernelSlot g_bmm{"flag_gems.ops.bmm", "bmm_kernel",
                 {"A", "B", "O", "M", "N", "K", "stride_ab", "stride_am", "stride_ak", "stride_bb",
                  "stride_bk", "stride_bn", "stride_ob", "stride_om", "stride_on", "TILE_M",
                  "TILE_N", "TILE_K", "GROUP_M", "DIVISIBLE_M", "DIVISIBLE_N", "DIVISIBLE_K"}};
KernelSlot g_addmm{"flag_gems.ops.addmm", "addmm_kernel",
                   {"a_ptr", "b_ptr", "i_ptr", "c_ptr", "alpha", "beta", "M", "N", "K",
                    "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_im", "stride_in",
                    "stride_cm", "stride_cn", "BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"}};
TunerSlot g_tune_bmm{&g_bmm, {"TILE_M", "TILE_N", "TILE_K", "GROUP_M"}};
TunerSlot g_tune_addmm{&g_addmm, {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K"}};

// LibTuner's strategies (utils/libentry.py).
int64_t log_strategy(int64_t v) {
  return static_cast<int64_t>(std::pow(2.0, std::ceil(std::log2(static_cast<double>(v)))));
}
int64_t align32(int64_t v) { return cdiv(v, 32) * 32; }

}  // namespace

Outcome plan_bmm(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* a = call.tensor(0);
  const at::Tensor* b = call.tensor(1);
  if (!a || !b || !is_float(a->scalar_type()) || a->scalar_type() != b->scalar_type() ||
      a->dim() != 3 || b->dim() != 3 || a->size(0) != b->size(0) || a->size(2) != b->size(1)) {
    return Outcome::kDecline;
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_bmm, plan, &o);
  if (!fn) return o;
  const int64_t batch = a->size(0), M = a->size(1), K = a->size(2), N = b->size(2);
  const int64_t dt = static_cast<int64_t>(a->scalar_type());
  const int64_t key[8] = {log_strategy(M), log_strategy(N), log_strategy(K),
                          align32(a->stride(1)), align32(b->stride(1)), dt, dt, dt};
  const TunedConfig* cfg = call.tuned(g_tune_bmm, key, 8, plan);
  if (!cfg) return Outcome::kNeedTuning;
  const int64_t tm = cfg->values[0], tn = cfg->values[1], tk = cfg->values[2];
  at::Tensor out = call.empty({batch, M, N}, a->scalar_type());
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(M, tm));
  L.grid[1] = static_cast<uint32_t>(cdiv(N, tn));
  L.grid[2] = static_cast<uint32_t>(batch);
  use_config(L, *cfg);
  L.ptr(*a);
  L.ptr(*b);
  L.ptr(out);
  L.i(M);
  L.i(N);
  L.i(K);
  for (int d = 0; d < 3; ++d) L.i(a->stride(d));
  for (int d = 0; d < 3; ++d) L.i(b->stride(d));
  for (int d = 0; d < 3; ++d) L.i(out.stride(d));
  L.i(tm);
  L.i(tn);
  L.i(tk);
  L.i(cfg->values[3]);
  L.b(M % tm == 0);
  L.b(N % tn == 0);
  L.b(K % tk == 0);
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// addmm(bias, mat1, mat2, *, beta, alpha): mat1 made contiguous, bias
// broadcast to [M, N] (stride 0 on broadcast dims).
Outcome plan_addmm(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* bias = call.tensor(0);
  const at::Tensor* m1 = call.tensor(1);
  const at::Tensor* m2 = call.tensor(2);
  if (!bias || !m1 || !m2 || !is_float(m1->scalar_type()) ||
      m1->scalar_type() != m2->scalar_type() || bias->scalar_type() != m1->scalar_type() ||
      m1->dim() != 2 || m2->dim() != 2 || bias->dim() > 2 || m1->size(1) != m2->size(0)) {
    return Outcome::kDecline;
  }
  abi::Value beta, alpha;
  if (!scalar_value(call.arg(3), &beta) || !scalar_value(call.arg(4), &alpha)) {
    return Outcome::kDecline;
  }
  const int64_t M = m1->size(0), K = m1->size(1), N = m2->size(1);
  // bias.broadcast_to((M, N)): expand's geometry (a new leading dim takes
  // stride size*stride of the next; a stretched size-1 dim takes 0).
  const int64_t target[2] = {M, N};
  int64_t bs[2] = {0, 0};
  const int64_t bdim = bias->dim();
  for (int64_t i = 1; i >= 0; --i) {
    const int64_t d = bdim - 2 + i;  // the bias dim aligned with output dim i
    int64_t size = d >= 0 ? bias->size(d) : 1;
    int64_t stride = d >= 0 ? bias->stride(d) : (i == 1 ? 1 : target[1] * bs[1]);
    if (size != target[i]) {
      if (size != 1) return Outcome::kDecline;  // FlagGems asserts
      stride = 0;
    }
    bs[i] = stride;
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_addmm, plan, &o);
  if (!fn) return o;
  const int64_t dt = static_cast<int64_t>(m1->scalar_type());
  const int64_t key[7] = {align32(M), align32(N), align32(K), dt, dt, dt, dt};
  const TunedConfig* cfg = call.tuned(g_tune_addmm, key, 7, plan);
  if (!cfg) return Outcome::kNeedTuning;
  at::Tensor a = call.contiguous(*m1, plan);
  at::Tensor out = call.empty({M, N}, m1->scalar_type());
  const int64_t bm = cfg->values[0], bn = cfg->values[1];
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(M, bm));
  L.grid[1] = static_cast<uint32_t>(cdiv(N, bn));
  use_config(L, *cfg);
  L.ptr(a);
  L.ptr(*m2);
  L.ptr(*bias);
  L.ptr(out);
  L.value(alpha);
  L.value(beta);
  L.i(M);
  L.i(N);
  L.i(K);
  L.i(a.stride(0));
  L.i(a.stride(1));
  L.i(m2->stride(0));
  L.i(m2->stride(1));
  L.i(bs[0]);
  L.i(bs[1]);
  L.i(out.stride(0));
  L.i(out.stride(1));
  L.i(cfg->values[0]);
  L.i(cfg->values[1]);
  L.i(cfg->values[2]);
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
