#include "distributed/process_group.h"

#include <string_view>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/mul.h>

#include "aten/native_view.h"
#include "distributed/comm_views.h"
#include "distributed/flagos_work.h"
#include "distributed/sparse_allreduce.h"
#include "runtime/device.h"

namespace torch_fl::distributed {
namespace {

using c10d::OpType;
using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using TensorList = std::vector<at::Tensor>;

// ReduceOp guarantees that a PREMUL_SUM carries this supplement (NCCL casts
// it the same way).
const c10d::NCCLPreMulSumSupplement* premul_factor(const c10d::ReduceOp& op) {
  auto* factor = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK_VALUE(factor != nullptr, "flagos backend: a PREMUL_SUM ReduceOp without a factor");
  return factor;
}

// The sizes a collective's arguments must have for a group of `size` ranks,
// checked before anything is sent so every rank fails alike and at once.
void check_count(std::string_view op, std::string_view what, size_t got, int64_t want,
                 int size, std::string_view unit = "tensors") {
  TORCH_CHECK_VALUE(static_cast<int64_t>(got) == want, "flagos backend: ", op, ": ", what,
                    " has ", got, " ", unit, "; the group has ", size, " ranks, so it needs ",
                    want);
}

void check_numel(std::string_view op, std::string_view what, const at::Tensor& t,
                 int64_t want, int size) {
  TORCH_CHECK_VALUE(t.numel() == want, "flagos backend: ", op, ": ", what, " has ", t.numel(),
                    " elements; the group has ", size, " ranks, so it needs ", want);
}

// An output and the input it is made from have one dtype: NCCL's
// all_gather_into_tensor and reduce_scatter_tensor raise TypeError otherwise,
// its coalesced forms and all_to_all_single would reinterpret the bytes, and
// gloo's own message names the CPU views flagos hands it.
void check_dtype(std::string_view op, std::string_view what, const at::Tensor& t,
                 std::string_view from, const at::Tensor& source) {
  TORCH_CHECK_TYPE(t.scalar_type() == source.scalar_type(), "flagos backend: ", op, ": ", what,
                    " is ", t.scalar_type(), " but ", from, " is ", source.scalar_type(),
                    "; the output of a collective has its input's dtype");
}

template <typename T>
std::vector<T> flatten(const std::vector<std::vector<T>>& lists) {
  std::vector<T> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

// Scales `inputs` by the PREMUL_SUM factor: in place, or into new tensors
// that replace them.
void premultiply(const c10d::NCCLPreMulSumSupplement& factor, TensorList& inputs,
                 bool in_place) {
  at::NoGradGuard no_grad;
  for (auto& t : inputs) {
    if (factor.tensor_factor.defined()) {
      t = in_place ? t.mul_(factor.tensor_factor) : at::mul(t, factor.tensor_factor);
    } else {
      t = in_place ? t.mul_(factor.double_factor) : at::mul(t, factor.double_factor);
    }
  }
}
void premultiply(const c10d::NCCLPreMulSumSupplement& factor,
                 std::vector<TensorList>& inputs, bool in_place) {
  for (auto& list : inputs) premultiply(factor, list, in_place);
}
void premultiply(const c10d::NCCLPreMulSumSupplement& factor, at::Tensor& input,
                 bool in_place) {
  TensorList list{input};
  premultiply(factor, list, in_place);
  input = list[0];
}

// The reduce op for the inner backend of a reduction of `inputs`, whose native
// views `native_in` the call's `views` made (as `what`):
// - PREMUL_SUM on NCCL: a flagos factor tensor becomes a native view, checked
//   with the call's other tensors.
// - PREMUL_SUM on a backend without it: SUM, after scaling the inputs by the
//   factor; `in_place` where the result overwrites them anyway, else into new
//   tensors whose views replace `native_in`.
// - any other op passes through.
template <typename Inputs>
c10d::ReduceOp inner_reduce_op(const c10d::ReduceOp& op, bool inner_has_premul_sum,
                               CommViews& views, const Inputs& inputs, Inputs& native_in,
                               std::string_view what, bool in_place) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return op;
  auto* factor = premul_factor(op);
  if (inner_has_premul_sum) {
    if (!factor->tensor_factor.defined() ||
        factor->tensor_factor.device().type() != runtime::kFlagos) {
      return op;
    }
    c10d::ReduceOp native;
    native.op_ = c10d::ReduceOp::PREMUL_SUM;
    native.supplement_ = c10::make_intrusive<c10d::NCCLPreMulSumSupplement>(
        views.view(factor->tensor_factor, "factor"));
    return native;
  }
  Inputs scaled = inputs;
  premultiply(*factor, scaled, in_place);
  if (!in_place) native_in = views.view(scaled, what);
  return c10d::ReduceOp::SUM;
}

}  // namespace

ProcessGroupFlagos::ProcessGroupFlagos(c10::intrusive_ptr<c10d::Backend> inner, int rank,
                                       int size, std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      inner_(std::move(inner)),
      // NCCL has PREMUL_SUM (ncclRedOpCreatePreMulSum); gloo and others not.
      inner_has_premul_sum_(inner_->getBackendName() == "nccl"),
      options_(c10::make_intrusive<Options>(kName, timeout)) {
  TORCH_CHECK_VALUE(inner_->getRank() == rank && inner_->getSize() == size,
                    "flagos backend: the inner ", inner_->getBackendName(),
                    " backend is rank ", inner_->getRank(), " of ", inner_->getSize(),
                    ", the group rank ", rank, " of ", size);
}

#if FLAGOS_TORCH_AT_LEAST(2, 13)
void ProcessGroupFlagos::setTimeout(std::chrono::milliseconds timeout) {
  inner_->setTimeout(timeout);
  options_->timeout = timeout;
}
#endif

WorkPtr ProcessGroupFlagos::wrap(WorkPtr inner, TensorList outputs,
                                 std::optional<c10::Device> device, OpType op) const {
  if (!inner) return inner;  // NCCL's, inside a coalescing block: stays null
  return c10::make_intrusive<FlagosWork>(std::move(inner), std::move(outputs), device,
                                         getRank(), op);
}

WorkPtr ProcessGroupFlagos::endCoalescing() {
  return wrap(inner_->endCoalescing(), {}, std::nullopt, OpType::COALESCED);
}

WorkPtr ProcessGroupFlagos::broadcast(TensorList& tensors, const c10d::BroadcastOptions& opts) {
  CommViews views("broadcast");
  auto native = views.view(tensors, "tensors");
  return wrap(inner_->broadcast(native, opts), tensors, views.device(), OpType::BROADCAST);
}

WorkPtr ProcessGroupFlagos::allreduce(TensorList& tensors, const c10d::AllreduceOptions& opts) {
  if (!tensors.empty() && tensors[0].defined() && tensors[0].is_sparse()) {
    return sparse_allreduce(*inner_, tensors, opts);
  }
  CommViews views("all_reduce");
  auto native = views.view(tensors, "tensors");
  c10d::AllreduceOptions o = opts;
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, tensors, native,
                               "tensors", /*in_place=*/true);  // overwritten by the result
  return wrap(inner_->allreduce(native, o), tensors, views.device(), OpType::ALLREDUCE);
}

WorkPtr ProcessGroupFlagos::allreduce_coalesced(TensorList& tensors,
                                                const c10d::AllreduceCoalescedOptions& opts) {
  CommViews views("all_reduce_coalesced");
  auto native = views.view(tensors, "tensors");
  c10d::AllreduceCoalescedOptions o = opts;
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, tensors, native,
                               "tensors", /*in_place=*/true);
  return wrap(inner_->allreduce_coalesced(native, o), tensors, views.device(),
              OpType::ALLREDUCE_COALESCED);
}

WorkPtr ProcessGroupFlagos::reduce(TensorList& tensors, const c10d::ReduceOptions& opts) {
  CommViews views("reduce");
  auto native = views.view(tensors, "tensors");
  c10d::ReduceOptions o = opts;
  // Only the root's tensor receives the result; the others stay unchanged.
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, tensors, native,
                               "tensors", /*in_place=*/opts.rootRank == getRank());
  return wrap(inner_->reduce(native, o), tensors, views.device(), OpType::REDUCE);
}

WorkPtr ProcessGroupFlagos::allgather(std::vector<TensorList>& outputs, TensorList& inputs,
                                      const c10d::AllgatherOptions& opts) {
  CommViews views("all_gather");
  auto native_out = views.view(outputs, "output_tensor_lists");
  auto native_in = views.view(inputs, "input_tensors");
  check_count("all_gather", "output_tensor_lists", outputs.size(), inputs.size(), getSize());
  for (const auto& list : outputs) {
    check_count("all_gather", "output_tensor_list", list.size(), getSize(), getSize());
  }
  return wrap(inner_->allgather(native_out, native_in, opts), flatten(outputs),
              views.device(), OpType::ALLGATHER);
}

WorkPtr ProcessGroupFlagos::_allgather_base(at::Tensor& output, at::Tensor& input,
                                            const c10d::AllgatherOptions& opts) {
  CommViews views("all_gather_into_tensor");
  auto native_out = views.view(output, "output_tensor");
  auto native_in = views.view(input, "input_tensor");
  check_numel("all_gather_into_tensor", "output_tensor", output, input.numel() * getSize(),
              getSize());
  check_dtype("all_gather_into_tensor", "output_tensor", output, "input_tensor", input);
  return wrap(inner_->_allgather_base(native_out, native_in, opts), {output},
              views.device(), OpType::_ALLGATHER_BASE);
}

WorkPtr ProcessGroupFlagos::allgather_coalesced(std::vector<TensorList>& output_lists,
                                                TensorList& inputs,
                                                const c10d::AllgatherOptions& opts) {
  CommViews views("all_gather_coalesced");
  auto native_out = views.view(output_lists, "output_tensor_lists");
  auto native_in = views.view(inputs, "input_tensors");
  return wrap(inner_->allgather_coalesced(native_out, native_in, opts), flatten(output_lists),
              views.device(), OpType::ALLGATHER_COALESCED);
}

WorkPtr ProcessGroupFlagos::allgather_into_tensor_coalesced(TensorList& outputs,
                                                            TensorList& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  CommViews views("all_gather_into_tensor_coalesced");
  auto native_out = views.view(outputs, "outputs");
  auto native_in = views.view(inputs, "inputs");
  check_count("all_gather_into_tensor_coalesced", "outputs", outputs.size(), inputs.size(),
              getSize());
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_numel("all_gather_into_tensor_coalesced", "an output", outputs[i],
                inputs[i].numel() * getSize(), getSize());
    check_dtype("all_gather_into_tensor_coalesced", "an output", outputs[i], "its input",
                inputs[i]);
  }
  return wrap(inner_->allgather_into_tensor_coalesced(native_out, native_in, opts), outputs,
              views.device(), OpType::COALESCED);
}

WorkPtr ProcessGroupFlagos::gather(std::vector<TensorList>& outputs, TensorList& inputs,
                                   const c10d::GatherOptions& opts) {
  CommViews views("gather");
  auto native_out = views.view(outputs, "gather_list");
  auto native_in = views.view(inputs, "tensor");
  if (opts.rootRank == getRank() && !outputs.empty()) {
    check_count("gather", "gather_list", outputs[0].size(), getSize(), getSize());
  }
  return wrap(inner_->gather(native_out, native_in, opts), flatten(outputs), views.device(),
              OpType::GATHER);
}

WorkPtr ProcessGroupFlagos::scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                    const c10d::ScatterOptions& opts) {
  CommViews views("scatter");
  auto native_out = views.view(outputs, "tensor");
  auto native_in = views.view(inputs, "scatter_list");
  if (opts.rootRank == getRank() && !inputs.empty()) {
    check_count("scatter", "scatter_list", inputs[0].size(), getSize(), getSize());
  }
  return wrap(inner_->scatter(native_out, native_in, opts), outputs, views.device(),
              OpType::SCATTER);
}

WorkPtr ProcessGroupFlagos::reduce_scatter(TensorList& outputs, std::vector<TensorList>& inputs,
                                           const c10d::ReduceScatterOptions& opts) {
  CommViews views("reduce_scatter");
  auto native_out = views.view(outputs, "output");
  auto native_in = views.view(inputs, "input_list");
  for (const auto& list : inputs) {
    check_count("reduce_scatter", "input_list", list.size(), getSize(), getSize());
  }
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, inputs, native_in,
                               "input_list", /*in_place=*/false);
  return wrap(inner_->reduce_scatter(native_out, native_in, o), outputs, views.device(),
              OpType::REDUCE_SCATTER);
}

WorkPtr ProcessGroupFlagos::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::ReduceScatterOptions& opts) {
  CommViews views("reduce_scatter_tensor");
  auto native_out = views.view(output, "output");
  auto native_in = views.view(input, "input");
  check_numel("reduce_scatter_tensor", "input", input, output.numel() * getSize(), getSize());
  check_dtype("reduce_scatter_tensor", "output", output, "input", input);
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, input, native_in,
                               "input", /*in_place=*/false);
  return wrap(inner_->_reduce_scatter_base(native_out, native_in, o), {output},
              views.device(), OpType::_REDUCE_SCATTER_BASE);
}

WorkPtr ProcessGroupFlagos::reduce_scatter_tensor_coalesced(
    TensorList& outputs, TensorList& inputs, const c10d::ReduceScatterOptions& opts) {
  CommViews views("reduce_scatter_tensor_coalesced");
  auto native_out = views.view(outputs, "outputs");
  auto native_in = views.view(inputs, "inputs");
  check_count("reduce_scatter_tensor_coalesced", "inputs", inputs.size(), outputs.size(),
              getSize());
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_numel("reduce_scatter_tensor_coalesced", "an input", inputs[i],
                outputs[i].numel() * getSize(), getSize());
    check_dtype("reduce_scatter_tensor_coalesced", "an output", outputs[i], "its input",
                inputs[i]);
  }
  c10d::ReduceScatterOptions o = opts;
  o.reduceOp = inner_reduce_op(opts.reduceOp, inner_has_premul_sum_, views, inputs, native_in,
                               "inputs", /*in_place=*/false);
  return wrap(inner_->reduce_scatter_tensor_coalesced(native_out, native_in, o), outputs,
              views.device(), OpType::COALESCED);
}

WorkPtr ProcessGroupFlagos::alltoall_base(at::Tensor& output, at::Tensor& input,
                                          std::vector<int64_t>& output_split_sizes,
                                          std::vector<int64_t>& input_split_sizes,
                                          const c10d::AllToAllOptions& opts) {
  CommViews views("all_to_all_single");
  auto native_out = views.view(output, "output");
  auto native_in = views.view(input, "input");
  if (!output_split_sizes.empty()) {
    check_count("all_to_all_single", "output_split_sizes", output_split_sizes.size(),
                getSize(), getSize(), "entries");
  }
  if (!input_split_sizes.empty()) {
    check_count("all_to_all_single", "input_split_sizes", input_split_sizes.size(),
                getSize(), getSize(), "entries");
  }
  check_dtype("all_to_all_single", "output", output, "input", input);
  return wrap(inner_->alltoall_base(native_out, native_in, output_split_sizes,
                                    input_split_sizes, opts),
              {output}, views.device(), OpType::ALLTOALL_BASE);
}

WorkPtr ProcessGroupFlagos::alltoall(TensorList& outputs, TensorList& inputs,
                                     const c10d::AllToAllOptions& opts) {
  CommViews views("all_to_all");
  auto native_out = views.view(outputs, "output_tensor_list");
  auto native_in = views.view(inputs, "input_tensor_list");
  check_count("all_to_all", "output_tensor_list", outputs.size(), getSize(), getSize());
  check_count("all_to_all", "input_tensor_list", inputs.size(), getSize(), getSize());
  return wrap(inner_->alltoall(native_out, native_in, opts), outputs, views.device(),
              OpType::ALLTOALL);
}

WorkPtr ProcessGroupFlagos::send(TensorList& tensors, int dst_rank, int tag) {
  CommViews views("send");
  auto native = views.view(tensors, "tensor");
  return wrap(inner_->send(native, dst_rank, tag), tensors, views.device(), OpType::SEND);
}

WorkPtr ProcessGroupFlagos::recv(TensorList& tensors, int src_rank, int tag) {
  CommViews views("recv");
  auto native = views.view(tensors, "tensor");
  return wrap(inner_->recv(native, src_rank, tag), tensors, views.device(), OpType::RECV);
}

WorkPtr ProcessGroupFlagos::recvAnysource(TensorList& tensors, int tag) {
  CommViews views("recv");
  auto native = views.view(tensors, "tensor");
  return wrap(inner_->recvAnysource(native, tag), tensors, views.device(),
              OpType::RECVANYSOURCE);
}

WorkPtr ProcessGroupFlagos::barrier(const c10d::BarrierOptions& opts) {
  c10d::BarrierOptions o = opts;
  // The inner backend picks its own device (NCCL: the cuda device of that
  // index); a flagos device means nothing to it.
  if (o.device && o.device->type() == c10::DeviceType::PrivateUse1) {
    o.device = aten::NativeViews::native_device(o.device->index());
  }
  return wrap(inner_->barrier(o), {}, std::nullopt, OpType::BARRIER);
}

}  // namespace torch_fl::distributed
