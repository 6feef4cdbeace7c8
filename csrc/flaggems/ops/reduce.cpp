// Reductions. Over one dim: mean.dim (ops/mean.py mean_dim_comm) and argmax
// (ops/argmax.py) view the input as [M, N, K] around the reduced dim (after
// .contiguous()) and pick a kernel by K: FlagGems' heuristics (runtime/backend/
// _nvidia/heuristics_config_utils.py) recomputed here, SM count included; so
// does cumsum's row scan. all.dim (ops/all.py all_dim) moves the reduced dim
// last (dim_compress) and runs an autotuned kernel over [M, N] rows. Over the
// whole tensor: all and max (WholeReduce).

#include <cmath>

#include "flaggems/cuda_launch.h"
#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

KernelSlot g_mean_vec{"flag_gems.ops.mean", "mean_dim_kernel_non_inner_vec",
                      {"output_ptr", "input_ptr", "M", "N", "K", "BLOCK_SIZE_K", "VEC_SIZE"}};
KernelSlot g_mean_non_inner{"flag_gems.ops.mean", "mean_dim_kernel_non_inner",
                            {"output_ptr", "input_ptr", "M", "N", "K", "TILE_N", "TILE_K",
                             "ONE_TILE_PER_CTA"}};
KernelSlot g_mean_inner{"flag_gems.ops.mean", "mean_dim_kernel_inner",
                        {"output_ptr", "input_ptr", "M", "N", "TILE_N", "ONE_TILE_PER_CTA"}};
KernelSlot g_argmax_non_inner{"flag_gems.ops.argmax", "argmax_kernel_non_inner",
                              {"inp", "out_index", "M", "N", "K", "TILE_K", "TILE_N",
                               "ONE_TILE_PER_CTA"}};
KernelSlot g_argmax_inner{"flag_gems.ops.argmax", "argmax_kernel_inner",
                          {"inp", "out_index", "M", "N", "TILE_N", "ONE_TILE_PER_CTA"}};
KernelSlot g_all_dim{"flag_gems.ops.all", "all_kernel_dim",
                     {"inp", "out", "M", "N", "BLOCK_M", "BLOCK_N"}};
TunerSlot g_tune_all_dim{&g_all_dim, {"BLOCK_M", "BLOCK_N"}};
KernelSlot g_cumsum_row{"flag_gems.ops.cumsum", "reduce_then_scan_root_scan_kernel_row",
                        {"in_ptr", "out_ptr", "N", "TILE_SIZE"}};

using heur::argmax_tile_k;
using heur::argmax_tile_n;
using heur::argmax_warps;
using heur::mean_tile_k;
using heur::mean_tile_n;
using heur::warps_by_tile;

// The sizes of the result: `dim` dropped, or kept as 1.
c10::SmallVector<int64_t, 6> reduced_shape(c10::IntArrayRef sizes, int64_t dim, bool keepdim) {
  c10::SmallVector<int64_t, 6> shape(sizes.begin(), sizes.end());
  if (keepdim) {
    shape[dim] = 1;
  } else {
    shape.erase(shape.begin() + dim);
  }
  return shape;
}

}  // namespace

// all(self), max(self): two kernels (per-block partial results, then their
// reduction) over the input as a flat buffer (FlagGems' wrappers: max makes
// it contiguous first, all reads it as is; a strided input goes to them).
Outcome plan_whole_reduce(const OpDesc& op, Call& call, CallPlan& plan) {
  const auto& r = *static_cast<const WholeReduce*>(op.family);
  const at::Tensor* self = call.tensor(0);
  if (!self || !self->is_contiguous() || self->numel() == 0 ||
      elem_type(self->scalar_type()) == abi::TType::kInvalid) {
    return Outcome::kDecline;  // empty: max raises, all is true; not planned here
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* k1 = need(*r.first, plan, &o);
  if (!k1) return o;
  const JitFn* k2 = need(*r.second, plan, &o);
  if (!k2) return o;
  const int64_t n = self->numel();
  const int64_t block = next_pow2(static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(n)))));
  const int64_t mid_size = cdiv(n, block);
  const c10::ScalarType dtype = r.bool_result ? c10::kBool : self->scalar_type();
  at::Tensor mid = call.empty({mid_size}, dtype);
  at::Tensor out = call.empty({}, dtype);
  plan.keep.push_back(mid);
  Launch& a = plan.add_launch();
  a.start(k1);
  a.grid[0] = static_cast<uint32_t>(mid_size);
  a.ptr(*self);
  a.ptr(mid);
  a.i(n);
  if (r.passes_mid_size) a.i(mid_size);
  a.i(block);
  Launch& b = plan.add_launch();
  b.start(k2);
  b.ptr(mid);
  b.ptr(out);
  b.i(mid_size);
  b.i(next_pow2(mid_size));
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// all.dim(self, dim, keepdim): dim_compress(self, dim), i.e. the other dims
// in order and `dim` last, made contiguous (a copy unless that order already
// is), then one program per BLOCK_M rows of N elements. all_kernel_dim is
// autotuned by LibTuner: key (M, N) and the two tensors' dtypes.
Outcome plan_all_dim(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  int64_t dim = 0;
  if (!self || self->dim() == 0 || self->numel() == 0 ||
      elem_type(self->scalar_type()) == abi::TType::kInvalid || !int_arg(call.arg(1), &dim) ||
      !wrap_dim(dim, self->dim(), &dim) || !call.arg(2).isBool()) {
    return Outcome::kDecline;  // 0-d: the wrapper's dim % ndim raises; empty: no rows
  }
  const bool keepdim = call.arg(2).toBool();
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_all_dim, plan, &o);
  if (!fn) return o;
  const int64_t N = self->size(dim);
  const int64_t M = self->numel() / N;
  const int64_t key[4] = {M, N, static_cast<int64_t>(self->scalar_type()),
                          static_cast<int64_t>(c10::kBool)};
  const TunedConfig* cfg = call.tuned(g_tune_all_dim, key, 4, plan);
  if (!cfg) return Outcome::kNeedTuning;

  // The attention mask's case, the last dim of a contiguous tensor, needs no
  // view: dim_compress leaves it as it is.
  at::Tensor inp = dim == self->dim() - 1 && self->is_contiguous()
                       ? *self
                       : call.contiguous(dim_last(*self, dim), plan);
  at::Tensor out = call.empty(reduced_shape(self->sizes(), dim, keepdim), c10::kBool);
  Launch& L = plan.add_launch();
  L.start(fn);
  use_config(L, *cfg);
  L.grid[0] = static_cast<uint32_t>(cdiv(M, cfg->values[0]));
  L.ptr(inp);
  L.ptr(out);
  L.i(M);
  L.i(N);
  L.i(cfg->values[0]);
  L.i(cfg->values[1]);
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// cumsum(self, dim, *, dtype) over the last dimension of a row short enough
// for one persistent kernel (cumsum_wrapper's K == 1, N <= 16384 branch).
Outcome plan_cumsum(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  int64_t dim = 0;
  if (!self || elem_type(self->scalar_type()) == abi::TType::kInvalid ||
      !int_arg(call.arg(1), &dim) || !wrap_dim(dim, self->dim(), &dim)) {
    return Outcome::kDecline;
  }
  const auto [M, N, K] = around_dim(*self, dim);
  if (K != 1 || N > 16384) return Outcome::kDecline;  // column / long scans
  c10::ScalarType dtype = self->scalar_type();
  if (!call.arg(2).isNone()) {
    if (!call.arg(2).isInt()) return Outcome::kDecline;
    dtype = static_cast<c10::ScalarType>(call.arg(2).toInt());
  } else if (c10::isIntegralType(dtype, /*includeBool=*/true)) {
    dtype = c10::kLong;
  }
  if (elem_type(dtype) == abi::TType::kInvalid) return Outcome::kDecline;
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_cumsum_row, plan, &o);
  if (!fn) return o;
  at::Tensor inp = call.contiguous(*self, plan);
  at::Tensor out = call.empty_like(inp, dtype);
  const int64_t tile = next_pow2(N);
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(M);
  L.num_warps = tile > 2048 ? 8 : 4;
  L.ptr(inp);
  L.ptr(out);
  L.i(N);
  L.i(tile);
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// mean.dim(self, dim, keepdim, *, dtype) / argmax(self, dim, keepdim).
Outcome plan_reduce_dim(const OpDesc& op, Call& call, CallPlan& plan) {
  const Reduce which = *static_cast<const Reduce*>(op.family);
  const bool is_mean = which == Reduce::kMean;
  const at::Tensor* self = call.tensor(0);
  if (!self) return Outcome::kDecline;
  // The result dtype: argmax's, or mean's (self's, or its dtype argument).
  c10::ScalarType out_dtype = is_mean ? self->scalar_type() : c10::kLong;
  if (is_mean && !call.arg(3).isNone()) {
    if (!call.arg(3).isInt()) return Outcome::kDecline;
    out_dtype = static_cast<c10::ScalarType>(call.arg(3).toInt());
  }
  // ATen refuses a mean whose result dtype is not floating or complex;
  // FlagGems' wrapper computes one. The native kernel serves it, and raises.
  if (is_mean && !c10::isFloatingType(out_dtype) && !c10::isComplexType(out_dtype)) {
    return Outcome::kNative;
  }
  if (!is_float(self->scalar_type()) || (is_mean && !is_float(out_dtype))) return Outcome::kDecline;
  int64_t dim = 0;
  const c10::IValue& dims = call.arg(1);
  if (is_mean) {
    if (!dims.isIntList()) return Outcome::kDecline;
    auto list = dims.toIntList();
    if (list.size() != 1) return Outcome::kDecline;  // several dims: dim_compress + autotuned kernel
    dim = list.get(0);
  } else if (!int_arg(dims, &dim)) {
    return Outcome::kDecline;  // argmax over everything: two kernels, not planned here
  }
  if (!wrap_dim(dim, self->dim(), &dim)) return Outcome::kDecline;
  if (!call.arg(2).isBool()) return Outcome::kDecline;
  const bool keepdim = call.arg(2).toBool();

  Outcome o = Outcome::kPlanned;
  const auto [M, N, K] = around_dim(*self, dim);
  const bool fp32 = self->scalar_type() == c10::kFloat;
  const int sms = cuda::sm_count(call.device());
  // FlagGems 5.0.2's argmax over a non-inner dim of N <= 128 elements uses
  // TILE_N = N, and tl.arange needs a power of 2: its wrapper raises a Triton
  // compile error for, say, argmax(0) of a 48-row tensor. CUDA's kernel serves it.
  if (!is_mean && K > 1 && N <= 128 && (N & (N - 1)) != 0) return Outcome::kNative;
  // Its inner kernel gives each row one program that walks the row in 4096-
  // element tiles: over fewer rows than SMs and rows longer than one tile
  // (greedy decoding's argmax over a vocabulary) most of the GPU idles, 25.7 µs
  // of GPU time against CUDA's 9.7 for 2 rows of 151,936 bf16 logits on an H100.
  // CUDA's kernel, which splits a row across blocks, serves those.
  if (!is_mean && K == 1 && N > 32 * 1024 && M < sms) return Outcome::kNative;
  const JitFn* fn;
  if (is_mean) {
    fn = need(K >= 1024 ? g_mean_vec : K > 1 ? g_mean_non_inner : g_mean_inner, plan, &o);
  } else {
    fn = need(K > 1 ? g_argmax_non_inner : g_argmax_inner, plan, &o);
  }
  if (!fn) return o;

  at::Tensor inp = call.contiguous(*self, plan);
  // torch.empty(shape with dim = 1), squeezed unless keepdim: the same
  // geometry as a contiguous tensor of the final shape.
  at::Tensor out = call.empty(reduced_shape(self->sizes(), dim, keepdim), out_dtype);
  Launch& L = plan.add_launch();
  L.start(fn);
  if (is_mean) {
    L.ptr(out);
    L.ptr(inp);
    L.i(M);
    L.i(N);
    if (K >= 1024) {
      const bool half = !fp32;
      const int64_t vec = half ? 8 : 1;
      const int64_t bk = half ? 128 : std::min<int64_t>(next_pow2(K), 512);
      L.i(K);
      L.i(bk);
      L.i(vec);
      L.grid[0] = static_cast<uint32_t>(M);
      L.grid[1] = static_cast<uint32_t>(cdiv(K, bk * vec));
      L.num_warps = bk <= 128 ? 8 : 16;
    } else if (K > 1) {
      const int64_t tk = mean_tile_k(M, K, sms);
      const int64_t tn = mean_tile_n(N, tk);
      L.i(K);
      L.i(tn);
      L.i(tk);
      L.b(tn >= N);
      L.grid[0] = static_cast<uint32_t>(M);
      L.grid[1] = static_cast<uint32_t>(cdiv(K, tk));
      L.num_warps = warps_by_tile(tn * tk);
    } else {
      inner_row_tiles(L, M, N);
    }
  } else {
    L.ptr(inp);
    L.ptr(out);
    L.i(M);
    L.i(N);
    if (K > 1) {
      const int64_t tk = argmax_tile_k(M, K, fp32, sms);
      const int64_t tn = argmax_tile_n(N, tk);
      if (next_pow2(tn) != tn) return Outcome::kDecline;  // FlagGems' kernel does not compile
      L.i(K);
      L.i(tk);
      L.i(tn);
      L.b(tn >= N);
      L.grid[0] = static_cast<uint32_t>(M);
      L.grid[1] = static_cast<uint32_t>(cdiv(K, tk));
      L.num_warps = argmax_warps(tn, fp32);
    } else {
      inner_row_tiles(L, M, N);
    }
  }
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
