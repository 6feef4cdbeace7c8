// The pointwise family: FlagGems' PointwiseDynamicFunction (utils/
// pointwise_dynamic.py), recomputed from tensor metadata. Its Python call
// promotes the output dtype, takes a 1-d "fast path" over dense operands of one
// layout, else broadcasts to the task shape (rank = its length), allocates
// the outputs like the first operand of the task shape, and launches the
// generated `<fn>_kernel_rank_<N>` with block pointers: tiles from the last
// dimension (next powers of two within the tile budget), a grid of
// min(max_grid0, tiles) CTAs, warps by tile size.

#include <ATen/native/TypeProperties.h>

#include "flaggems/ops/common.h"

namespace torch_fl::flaggems::ops {
namespace {

constexpr int kMaxOperands = 5;  // out0 + up to 4 inputs

c10::ScalarType promote(const PointwiseInfo::Promotion& pr, const PointwiseOp& pw, Call& call,
                        bool* ok) {
  at::native::ResultTypeState state{};
  for (int a : pr.args) {
    if (a < 0 || a >= pw.nargs) {
      *ok = false;
      return c10::kFloat;
    }
    const c10::IValue& v = call.arg(pw.args[a]);
    if (v.isTensor()) {
      state = at::native::update_result_type_state(v.toTensor(), state);
    } else if (v.isScalar()) {
      state = at::native::update_result_type_state(v.toScalar(), state);
    } else {
      *ok = false;
      return c10::kFloat;
    }
  }
  const c10::ScalarType r = at::native::result_type(state);
  using M = PointwiseInfo::Method;
  switch (pr.method) {
    case M::kDefault:
    case M::kNoOpmath:
      return r;
    case M::kIntToFloat:
      return c10::isIntegralType(r, /*includeBool=*/true)
                 ? c10::typeMetaToScalarType(c10::get_default_dtype())
                 : r;
    case M::kAlwaysBool:
      return c10::kBool;
    case M::kBoolToLong:
      return r == c10::kBool ? c10::kLong : r;
    case M::kOther:
      break;
  }
  *ok = false;  // COMPLEX_TO_FLOAT and others: not served here
  return r;
}

// FlagGems' broadcast of the input shapes (right-aligned; 1 stretches).
bool broadcast(c10::SmallVector<int64_t, 6>& task, c10::IntArrayRef s) {
  if (s.size() > task.size()) task.insert(task.begin(), s.size() - task.size(), 1);
  const size_t off = task.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    int64_t& t = task[off + i];
    if (t == s[i] || s[i] == 1) continue;
    if (t != 1) return false;
    t = s[i];
  }
  return true;
}

// shape_utils.broadcasted_stride: 0 where a size-1 dimension stretches.
void broadcasted_stride(const at::Tensor& t, c10::IntArrayRef task, int64_t* out) {
  const size_t r2 = task.size(), r1 = static_cast<size_t>(t.dim());
  const size_t d = r2 - r1;
  for (size_t i = 0; i < r2; ++i) out[i] = 0;
  for (size_t i = 0; i < r1; ++i) out[d + i] = (t.size(i) == 1 && task[d + i] > 1) ? 0 : t.stride(i);
}

// shape_utils.stride_order: dimensions sorted by |stride| (stable).
void stride_order(const int64_t* st, int n, int64_t* out) {
  for (int i = 0; i < n; ++i) out[i] = i;
  for (int i = 1; i < n; ++i) {  // insertion sort: stable
    int64_t x = out[i];
    int j = i - 1;
    while (j >= 0 && std::llabs(st[out[j]]) > std::llabs(st[x])) {
      out[j + 1] = out[j];
      --j;
    }
    out[j + 1] = x;
  }
}

bool internal_overlap(const at::Tensor& t) {
  if (t.is_contiguous() || t.is_non_overlapping_and_dense()) return false;
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) > 1 && t.stride(i) == 0) return true;
  }
  return false;
}

// Not exported yet: records the request for `slot`'s layout (rank 0) or its
// rank-`rank` kernel in `plan` (kNeedExport); kDecline when that export failed.
Outcome need(PointwiseSlot& slot, int rank, CallPlan& plan) {
  const SlotState s = rank == 0 ? slot.state.load() : slot.rank_state[rank].load();
  if (s == SlotState::kFailed) return Outcome::kDecline;
  plan.need_pointwise = &slot;
  plan.need_rank = rank;
  return Outcome::kNeedExport;
}

}  // namespace

Outcome plan_pointwise(const OpDesc& op, Call& call, CallPlan& plan) {
  const auto& pw = *static_cast<const PointwiseOp*>(op.family);
  PointwiseSlot* slot = pw.fn;
  if (pw.alt) {  // lerp_scalar: `if weight < 0.5` picks the head kernel
    abi::Value w;
    if (!scalar_value(call.arg(pw.args[2]), &w)) return Outcome::kDecline;
    const double wv = w.kind == abi::Kind::kFloat ? w.f : w.kind == abi::Kind::kInt ? double(w.i) : double(w.b);
    if (!(wv < 0.5)) slot = pw.alt;
  }
  const PointwiseInfo* info = slot->info.load(std::memory_order_acquire);
  if (!info) return need(*slot, 0, plan);
  if (info->tile_1d || !info->block_pointer || info->promotions.size() != 1 ||
      static_cast<int>(info->is_tensor.size()) != pw.nargs) {
    return Outcome::kDecline;
  }

  // Operands: inputs in positional order, scalars as Python passes them.
  const at::Tensor* ins[4];
  int nin = 0;
  for (int k = 0; k < pw.nargs; ++k) {
    if (!info->is_tensor[k]) continue;
    const at::Tensor* t = call.tensor(pw.args[k]);
    if (!t || elem_type(t->scalar_type()) == abi::TType::kInvalid) return Outcome::kDecline;
    ins[nin++] = t;
  }
  if (pw.refuses_bool && nin > 0 && ins[0]->scalar_type() == c10::kBool) return Outcome::kNative;
  // masked_fill_: ATen wants a bool mask, and FlagGems' wrapper special-cases a
  // 0-d self. (A mask that does not broadcast to self is declined below, as
  // for every in-place op: the task shape must be self's.)
  if (pw.masked && (ins[0]->dim() == 0 || ins[1]->scalar_type() != c10::kBool)) {
    return Outcome::kDecline;
  }
  bool ok = true;
  at::Tensor out;  // out0 when given (in place, or where's torch.empty)
  c10::ScalarType out_dtype = promote(info->promotions[0], pw, call, &ok);
  if (!ok) return Outcome::kDecline;
  if (pw.inplace) {
    const at::Tensor* self = call.tensor(0);
    if (!self) return Outcome::kDecline;
    out = *self;
  } else if (pw.where) {
    // where_self_out: result_type(self, other), casts (declined here), a bool
    // condition, out = torch.empty(broadcast_shapes(c, a, b)).
    if (nin != 3 || ins[0]->scalar_type() != c10::kBool ||
        ins[1]->scalar_type() != ins[2]->scalar_type()) {
      return Outcome::kDecline;
    }
    c10::SmallVector<int64_t, 6> shape;
    for (int i = 0; i < 3; ++i) {
      if (!broadcast(shape, ins[i]->sizes())) return Outcome::kDecline;
    }
    out = call.empty(shape, ins[1]->scalar_type());
  }

  const at::Tensor* tensors[kMaxOperands];
  int nt = 0;
  if (out.defined()) tensors[nt++] = &out;
  for (int i = 0; i < nin; ++i) tensors[nt++] = ins[i];
  if (tensors[0]->numel() > std::numeric_limits<int32_t>::max()) return Outcome::kDecline;

  bool same_shape = true, contiguous = true, same_stride = true;
  for (int i = 0; i < nt; ++i) {
    same_shape &= tensors[i]->sizes() == tensors[0]->sizes();
    contiguous &= tensors[i]->is_contiguous();
    same_stride &= tensors[i]->strides() == tensors[0]->strides();
  }
  const bool fast = same_shape && (contiguous || (same_stride && tensors[0]->is_non_overlapping_and_dense()));

  c10::SmallVector<int64_t, 6> task;
  int64_t strides[kMaxOperands][kMaxPointwiseRank];
  if (fast) {
    if (!out.defined()) out = call.empty_like(*tensors[0], out_dtype);
    task.push_back(tensors[0]->numel());
  } else {
    for (int i = 0; i < nin; ++i) {
      if (!broadcast(task, ins[i]->sizes())) return Outcome::kDecline;
    }
    if (out.defined() && (out.sizes() != c10::IntArrayRef(task) || internal_overlap(out))) {
      return Outcome::kDecline;  // FlagGems raises; its wrapper says why
    }
    if (static_cast<int>(task.size()) > kMaxPointwiseRank) return Outcome::kDecline;
    if (!out.defined()) {
      const at::Tensor* like = nullptr;
      for (int i = 0; i < nt && !like; ++i) {
        if (tensors[i]->sizes() == c10::IntArrayRef(task)) like = tensors[i];
      }
      out = like ? call.empty_like(*like, out_dtype) : call.empty(task, out_dtype);
    }
  }
  const int ndim = static_cast<int>(task.size());
  if (ndim < 1 || ndim > kMaxPointwiseRank) return Outcome::kDecline;

  const JitFn* fn = slot->rank_fn[ndim].load(std::memory_order_acquire);
  if (!fn) return need(*slot, ndim, plan);

  // Strides of every operand in the task space: inputs, then the output.
  const at::Tensor* operands[kMaxOperands];
  int nops = 0;
  for (int i = 0; i < nin; ++i) operands[nops++] = ins[i];
  operands[nops++] = &out;
  for (int i = 0; i < nops; ++i) {
    if (fast) {
      strides[i][0] = 1;
    } else {
      broadcasted_stride(*operands[i], task, strides[i]);
    }
  }

  // Task partition (gen_task_partition).
  int64_t tiles[kMaxPointwiseRank];
  heur::tile_sizes(info->max_tile, task.data(), ndim, tiles);
  int64_t tile_size = 1, num_tiles = 1, num_tasks = 1;
  for (int i = 0; i < ndim; ++i) {
    tile_size *= tiles[i];
    num_tiles *= cdiv(task[i], tiles[i]);
    num_tasks *= task[i];
  }
  const int64_t num_ctas = std::min<int64_t>(info->max_grid0, num_tiles);
  const int64_t tiles_per_cta = cdiv(num_tiles, num_ctas);

  Launch& L = plan.add_launch();
  L.start(fn);
  L.grid[0] = static_cast<uint32_t>(num_ctas);
  L.num_warps = static_cast<uint8_t>(heur::warps_by_tile(tile_size));
  int ti = 0;
  for (int k = 0; k < pw.nargs; ++k) {
    if (info->is_tensor[k]) {
      L.ptr(*ins[ti++]);
    } else {
      abi::Value v;
      if (!scalar_value(call.arg(pw.args[k]), &v)) return Outcome::kDecline;
      L.value(v);
    }
  }
  L.ptr(out);
  int64_t order[kMaxPointwiseRank];
  for (int i = 0; i < nops; ++i) {
    for (int d = 0; d < ndim; ++d) L.i(strides[i][d]);
    stride_order(strides[i], ndim, order);
    for (int d = 0; d < ndim; ++d) L.i(order[d]);
  }
  for (int d = 0; d < ndim; ++d) L.i(task[d]);
  L.i(num_tasks);
  L.i(tiles_per_cta);
  for (int d = 0; d < ndim; ++d) L.i(tiles[d]);
  L.b(tiles_per_cta == 1);

  plan.results.push_back(pw.inplace ? call.arg(0) : c10::IValue(out));
  return Outcome::kPlanned;
}

}  // namespace torch_fl::flaggems::ops
