// Data movement: cat (ops/cat.py), index_select (ops/index_select.py; what
// embedding decomposes into on flagos) and embedding_dense_backward
// (ops/embedding_dense_backward.py). Copies FlagGems' wrappers make
// (.contiguous(), dim_compress, the permute back) are made here too, with
// flagos' own copy.

#include <ATen/TensorUtils.h>

#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

KernelSlot g_cat{"flag_gems.ops.cat", "cat_copy_func_kernel_4",
                 {"out_ptr", "in_ptr_a", "in_ptr_b", "in_ptr_c", "in_ptr_d", "dim_size_in_a",
                  "dim_size_in_b", "dim_size_in_c", "dim_size_in_d", "dim_size_out",
                  "dim_prod_post", "dim_offset_a", "dim_offset_b", "dim_offset_c",
                  "dim_offset_d", "total_elements_a", "total_elements_b", "total_elements_c",
                  "total_elements_d", "BLOCK_X"}};
KernelSlot g_index_select{"flag_gems.ops.index_select", "index_select_kernel",
                          {"inp", "out", "M", "N", "index", "index_len", "BLOCK_M", "BLOCK_N"}};
KernelSlot g_embedding_bwd{"flag_gems.ops.embedding_dense_backward",
                           "_embedding_dense_backward_kernel",
                           {"grad_output_ptr", "indices_ptr", "grad_weight_ptr", "num_weights",
                            "padding_idx", "BLOCK_D", "EMBED_DIM"}};

constexpr int kMaxCatInputs = 4 * kMaxLaunches;

}  // namespace

// cat(Tensor[] tensors, int dim): inputs four at a time into cat_copy_func_kernel_4.
Outcome plan_cat(const OpDesc&, Call& call, CallPlan& plan) {
  const c10::IValue& list = call.arg(0);
  if (!list.isTensorList()) return Outcome::kDecline;
  auto items = list.toListRef();
  const int n = static_cast<int>(items.size());
  if (n < 2 || n > kMaxCatInputs) return Outcome::kDecline;  // one input: FlagGems returns it
  const at::Tensor* ts[kMaxCatInputs];
  for (int i = 0; i < n; ++i) {
    ts[i] = call.tensor_value(items[i]);
    if (!ts[i] || elem_type(ts[i]->scalar_type()) == abi::TType::kInvalid) return Outcome::kDecline;
    if (ts[i]->scalar_type() != ts[0]->scalar_type() || ts[i]->dim() != ts[0]->dim()) {
      return Outcome::kDecline;  // FlagGems promotes with .to() / raises
    }
  }
  int64_t dim = 0;
  if (!int_arg(call.arg(1), &dim) || !wrap_dim(dim, ts[0]->dim(), &dim)) return Outcome::kDecline;
  c10::SmallVector<int64_t, 6> out_shape(ts[0]->sizes().begin(), ts[0]->sizes().end());
  out_shape[dim] = 0;
  for (int i = 0; i < n; ++i) {
    for (int64_t d = 0; d < ts[0]->dim(); ++d) {
      if (d != dim && ts[i]->size(d) != ts[0]->size(d)) return Outcome::kDecline;
    }
    out_shape[dim] += ts[i]->size(dim);
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_cat, plan, &o);
  if (!fn) return o;

  at::Tensor out = call.empty(out_shape, ts[0]->scalar_type());
  const int64_t post = prod(ts[0]->sizes(), static_cast<size_t>(dim) + 1, ts[0]->dim());
  int64_t offset = 0;
  for (int start = 0; start < n; start += 4) {
    const int nb = std::min(4, n - start);
    at::Tensor in[4];
    int64_t size_in[4], off[4], total[4], max_total = 0;
    for (int j = 0; j < 4; ++j) {
      if (j < nb) {
        in[j] = call.contiguous(*ts[start + j], plan);
        size_in[j] = in[j].size(dim);
        off[j] = offset;
        total[j] = in[j].numel();
        offset += size_in[j];
      } else {
        in[j] = *ts[start];  // FlagGems passes the batch's first input, unconverted
        size_in[j] = off[j] = total[j] = 0;
      }
      max_total = std::max(max_total, total[j]);
    }
    Launch& L = plan.add_launch();
    L.start(fn);
    L.grid[0] = static_cast<uint32_t>(cdiv(max_total, 1024));
    L.grid[1] = static_cast<uint32_t>(nb);
    L.ptr(out);
    for (int j = 0; j < 4; ++j) L.ptr(in[j]);
    for (int j = 0; j < 4; ++j) L.i(size_in[j]);
    L.i(out_shape[dim]);
    L.i(post);
    for (int j = 0; j < 4; ++j) L.i(off[j]);
    for (int j = 0; j < 4; ++j) L.i(total[j]);
    L.i(1024);
  }
  plan.results.push_back(out);
  return Outcome::kPlanned;
}

// index_select(self, dim, index): dim_compress (the selected dim last, made
// contiguous), the kernel, then the permute back made contiguous.
Outcome plan_index_select(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* self = call.tensor(0);
  const at::Tensor* index = call.tensor(2);
  if (!self || !index || elem_type(self->scalar_type()) == abi::TType::kInvalid) {
    return Outcome::kDecline;
  }
  if (index->dim() != 1 || !index->is_contiguous() ||
      (index->scalar_type() != c10::kLong && index->scalar_type() != c10::kInt)) {
    return Outcome::kDecline;  // the kernel reads the index as a flat buffer
  }
  const int64_t ndim = self->dim();
  int64_t dim = 0;
  if (!int_arg(call.arg(1), &dim) || !wrap_dim(dim, ndim, &dim)) return Outcome::kDecline;
  if (ndim > 6) return Outcome::kDecline;
  at::Tensor view = dim_last(*self, dim);
  // Unless the selected dim is innermost in memory, FlagGems' wrapper copies
  // the whole input to make it so: O(input) work for an O(output) result. For
  // an embedding lookup that is a transposed copy of the table per call (an
  // H100: 143 us of GPU time for 64 rows of a 32000x512 table, CUDA's kernel
  // 2.4 us). CUDA's kernel serves such calls; the bits are the same (a copy).
  if (!view.is_contiguous() && self->size(dim) > index->numel()) {
    return Outcome::kNative;
  }
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_index_select, plan, &o);
  if (!fn) return o;

  at::Tensor inp = call.contiguous(view, plan);
  const int64_t N = self->size(dim);
  const int64_t M = inp.numel() / N;
  const int64_t index_len = index->numel();
  c10::SmallVector<int64_t, 6> out_shape(inp.sizes().begin(), inp.sizes().end());
  out_shape.back() = index_len;
  at::Tensor out = call.empty(out_shape, self->scalar_type());
  const int64_t bm = heur::index_select_block_m(N);
  const int64_t bn = heur::index_select_block_n(N);
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(cdiv(M, bm));
  L.grid[1] = static_cast<uint32_t>(cdiv(index_len, bn));
  L.ptr(inp);
  L.ptr(out);
  L.i(M);
  L.i(N);
  L.ptr(*index);
  L.i(index_len);
  L.i(bm);
  L.i(bn);
  if (dim == ndim - 1) {
    plan.results.push_back(out);
    return Outcome::kPlanned;
  }
  // out.permute(order).contiguous().reshape(...): order = [0, .., ndim-2] with
  // ndim-1 at dim. A permuted view that is contiguous already (size-1 dims)
  // stays a view, whose strides the reshape recomputes (computeStride).
  int64_t back[6];
  int64_t k = 0;
  for (int64_t i = 0; i < ndim; ++i) back[i] = i == dim ? ndim - 1 : k++;
  at::Tensor view_back = permuted(out, back);
  at::Tensor result;
  if (view_back.is_contiguous()) {
    auto strides =
        at::detail::computeStride(view_back.sizes(), view_back.strides(), view_back.sizes());
    if (!strides) return Outcome::kDecline;
    result = view_of(out, view_back.sizes(), *strides, out.storage_offset());
  } else {
    plan.keep.push_back(out);
    plan.post_src = view_back;
    result = call.empty(view_back.sizes(), view_back.scalar_type());
    plan.post_dst = result;
    plan.post = post_copy;
  }
  plan.results.push_back(result);
  return Outcome::kPlanned;
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
// scale_grad_by_freq): float32 atomics into a zeroed buffer, cast at the end.
Outcome plan_embedding_backward(const OpDesc&, Call& call, CallPlan& plan) {
  const at::Tensor* grad = call.tensor(0);
  const at::Tensor* indices = call.tensor(1);
  int64_t num_weights = 0, padding_idx = 0;
  if (!grad || !indices || !is_float(grad->scalar_type()) || grad->dim() < 2 ||
      (indices->scalar_type() != c10::kLong && indices->scalar_type() != c10::kInt) ||
      !int_arg(call.arg(2), &num_weights) || !int_arg(call.arg(3), &padding_idx) ||
      !call.arg(4).isBool() || call.arg(4).toBool()) {
    return Outcome::kDecline;  // scale_grad_by_freq: two more kernels, not planned here
  }
  const int64_t D = grad->size(-1);
  if (grad->numel() / D != indices->numel()) return Outcome::kDecline;  // FlagGems asserts
  Outcome o = Outcome::kPlanned;
  const JitFn* fn = need(g_embedding_bwd, plan, &o);
  if (!fn) return o;
  at::Tensor go = call.contiguous(*grad, plan);
  at::Tensor idx = call.contiguous(*indices, plan);
  at::Tensor gw = call.zeros({num_weights, D}, c10::kFloat);
  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(idx.numel());
  L.grid[1] = static_cast<uint32_t>(cdiv(D, 128));
  L.ptr(go);
  L.ptr(idx);
  L.ptr(gw);
  L.i(num_weights);
  L.i(padding_idx);
  L.i(128);
  L.i(D);
  if (grad->scalar_type() == c10::kFloat) {
    plan.results.push_back(gw);
  } else {
    at::Tensor result = call.empty({num_weights, D}, grad->scalar_type());
    plan.keep.push_back(gw);
    plan.post_src = gw;
    plan.post_dst = result;
    plan.post = post_copy;
    plan.results.push_back(result);
  }
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
