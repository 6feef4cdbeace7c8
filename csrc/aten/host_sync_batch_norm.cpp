#include "aten/host_sync_batch_norm.h"

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <ATen/ops/var_mean.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>

#include <string_view>
#include <vector>

namespace torch_fl::aten {
namespace {

// Every dimension but the channels' (dim 1).
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "SyncBatchNorm expects an input of at least 2 dimensions, got ",
              input.dim());
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector shaped to broadcast against `input`: (1, C, 1, ...).
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = v.numel();
  return v.reshape(shape);
}

// The dtype CUDA keeps statistics in: float for half-precision inputs.
c10::ScalarType stats_type(const at::Tensor& input) {
  return at::toOpMathType(input.scalar_type());
}

// CUDA's InvStd: 0 where the variance and epsilon are both 0, not infinity.
at::Tensor inv_std(const at::Tensor& var, double eps) {
  at::Tensor invstd = var.add(eps).rsqrt();
  return eps == 0 ? at::where(var.eq(0), at::zeros_like(invstd), invstd) : invstd;
}

at::Tensor optional_tensor(const c10::IValue& v) {
  return v.isNone() ? at::Tensor() : v.toTensor();
}

void replace(torch::jit::Stack* stack, size_t n, std::vector<at::Tensor> results) {
  torch::jit::drop(*stack, n);
  for (at::Tensor& r : results) torch::jit::push(*stack, std::move(r));
}

// batch_norm_stats(Tensor input, float eps) -> (mean, invstd)
void stats(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 2);
  const at::Tensor input = args[0].toTensor();
  const double eps = args[1].toDouble();
  auto [var, mean] = at::var_mean(input.to(stats_type(input)), reduced_dims(input),
                                  /*correction=*/0, /*keepdim=*/false);
  replace(stack, 2, {mean, inv_std(var, eps)});
}

// batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean?,
// running_var?, float momentum, float eps, Tensor counts) -> (mean, invstd):
// the replicas' statistics merged, weighted by their element counts, and the
// running statistics updated (the variance unbiased), as CUDA does.
// batch_norm_gather_stats takes `int count`, the same for every replica.
void gather_stats(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 8);
  const at::Tensor mean = args[1].toTensor();  // (replicas, C)
  const at::Tensor invstd = args[2].toTensor();
  const at::Tensor running_mean = optional_tensor(args[3]);
  const at::Tensor running_var = optional_tensor(args[4]);
  const double momentum = args[5].toDouble();
  const double eps = args[6].toDouble();
  const c10::ScalarType acc = at::toOpMathType(mean.scalar_type());
  const at::Tensor m = mean.to(acc);
  const at::Tensor counts =
      args[7].isInt() ? at::full({mean.size(0), 1}, static_cast<double>(args[7].toInt()),
                                 m.options())
                      : args[7].toTensor().to(acc).reshape({-1, 1});
  const at::Tensor var = invstd.to(acc).reciprocal().square().sub(eps);  // each replica's, biased
  // No replica with elements (SyncBatchNorm drops empty ones): a mean and a
  // variance of 0, as CUDA's merge loop leaves them, not 0/0.
  const at::Tensor n = counts.sum();
  const at::Tensor avg = at::where(n.gt(0), m.mul(counts).sum(0).div(n), 0);
  const at::Tensor var_n = var.mul(counts).sum(0).add(m.sub(avg).square().mul(counts).sum(0));
  if (running_mean.defined()) {
    running_mean.copy_(running_mean.to(acc).mul(1 - momentum).add(avg, momentum));
  }
  if (running_var.defined()) {
    running_var.copy_(running_var.to(acc).mul(1 - momentum).add(var_n.div(n.sub(1)), momentum));
  }
  replace(stack, 8, {avg.to(mean.scalar_type()), inv_std(var_n.div(n), eps).to(mean.scalar_type())});
}

at::Tensor normalized(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                      const at::Tensor& mean, const at::Tensor& invstd) {
  const c10::ScalarType acc = stats_type(input);
  at::Tensor out = input.to(acc)
                       .sub(per_channel(mean.to(acc), input))
                       .mul(per_channel(invstd.to(acc), input));
  if (weight.defined()) out = out.mul(per_channel(weight.to(acc), input));
  if (bias.defined()) out = out.add(per_channel(bias.to(acc), input));
  return out.to(input.scalar_type());
}

// batch_norm_elemt(input, weight?, bias?, mean, invstd, float eps) -> Tensor,
// and its .out variant (..., *, Tensor(a!) out).
void elemt(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const bool out_variant = op.schema().arguments().size() == 7;
  const size_t n = out_variant ? 7 : 6;
  auto args = torch::jit::last(*stack, n);
  at::Tensor result = normalized(args[0].toTensor(), optional_tensor(args[1]),
                                 optional_tensor(args[2]), args[3].toTensor(),
                                 args[4].toTensor());
  if (out_variant) result = into_out(args[6].toTensor(), result);
  replace(stack, n, {std::move(result)});
}

// batch_norm_backward_reduce(grad_out, input, mean, invstd, weight?, bool
// input_g, bool weight_g, bool bias_g) -> (sum_dy, sum_dy_xmu, grad_weight,
// grad_bias), each undefined where its flag is off.
void backward_reduce(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 8);
  const at::Tensor grad_out = args[0].toTensor();
  const at::Tensor input = args[1].toTensor();
  const at::Tensor mean = args[2].toTensor();
  const at::Tensor invstd = args[3].toTensor();
  const at::Tensor weight = optional_tensor(args[4]);
  const bool input_g = args[5].toBool(), weight_g = args[6].toBool(), bias_g = args[7].toBool();
  const c10::ScalarType acc = stats_type(input);
  const std::vector<int64_t> dims = reduced_dims(input);
  const at::Tensor dy = grad_out.to(acc);
  const at::Tensor sum_dy = dy.sum(dims);
  const at::Tensor sum_dy_xmu =
      dy.mul(input.to(acc).sub(per_channel(mean.to(acc), input))).sum(dims);
  // Gradients of the affine parameters in the weight's dtype (the input's
  // when there is none).
  const c10::ScalarType param = weight.defined() ? weight.scalar_type() : input.scalar_type();
  const c10::ScalarType stat = mean.scalar_type();
  replace(stack, 8,
          {input_g ? sum_dy.to(stat) : at::Tensor(),
           input_g ? sum_dy_xmu.to(stat) : at::Tensor(),
           weight_g ? sum_dy_xmu.mul(invstd.to(acc)).to(param) : at::Tensor(),
           bias_g ? sum_dy.to(param) : at::Tensor()});
}

// batch_norm_backward_elemt(grad_out, input, mean, invstd, weight?, sum_dy,
// sum_dy_xmu, Tensor count) -> grad_input, where sum_dy and sum_dy_xmu are
// summed over every replica and count holds each replica's element count.
void backward_elemt(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 8);
  const at::Tensor grad_out = args[0].toTensor();
  const at::Tensor input = args[1].toTensor();
  const at::Tensor weight = optional_tensor(args[4]);
  const c10::ScalarType acc = stats_type(input);
  const at::Tensor norm = args[7].toTensor().to(acc).sum().reciprocal();
  const at::Tensor invstd = per_channel(args[3].toTensor().to(acc), input);
  const at::Tensor mean_dy = per_channel(args[5].toTensor().to(acc).mul(norm), input);
  const at::Tensor mean_dy_xmu = per_channel(args[6].toTensor().to(acc).mul(norm), input);
  const at::Tensor xmu = input.to(acc).sub(per_channel(args[2].toTensor().to(acc), input));
  at::Tensor grad = grad_out.to(acc).sub(mean_dy).sub(xmu.mul(invstd.square()).mul(mean_dy_xmu));
  grad = grad.mul(invstd);
  if (weight.defined()) grad = grad.mul(per_channel(weight.to(acc), input));
  replace(stack, 8, {grad.to(input.scalar_type())});
}

}  // namespace

HostKernel sync_batch_norm_kernel(const c10::OperatorName& name) {
  const std::string_view op = name.name;
  const std::string_view overload = name.overload_name;
  if (op == "aten::batch_norm_elemt" && (overload.empty() || overload == "out")) return &elemt;
  if (!overload.empty()) return nullptr;  // the other .out variants are composite
  if (op == "aten::batch_norm_stats") return &stats;
  if (op == "aten::batch_norm_gather_stats" ||
      op == "aten::batch_norm_gather_stats_with_counts") {
    return &gather_stats;
  }
  if (op == "aten::batch_norm_backward_reduce") return &backward_reduce;
  if (op == "aten::batch_norm_backward_elemt") return &backward_elemt;
  return nullptr;
}

}  // namespace torch_fl::aten
