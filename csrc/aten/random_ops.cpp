// Random operators whose native kernels draw from the native device's default
// generator internally, with no Generator argument the routing path could
// replace. On flagos they are written in terms of flagos operators, so the
// randomness comes from the flagos generator (torch.flagos.manual_seed) and
// matches the native kernel's algorithm step for step.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>
#include <torch/library.h>

#include "aten/fallback.h"
#include "runtime/cuda_bridge.h"

namespace torch_fl::aten {
namespace {

// The algorithm of PyTorch's CPU native_dropout (aten/native/Dropout.cpp).
// On the cuda driver the flagos default generator is CUDA's default one, so
// CUDA's fused kernel already draws from it: the op is routed as usual.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input,
                                                  double p,
                                                  std::optional<bool> train) {
  if (runtime::uses_cuda()) {
    static const auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_dropout", "");
    // No `train` means training to the CPU and CUDA kernels; FlagGems' kernel
    // reads None as false, so the route gets the value the native kernels mean.
    torch::jit::Stack stack{input, p, std::optional<bool>(train.value_or(true))};
    route_boxed(op, &stack);
    return std::make_tuple(stack[0].toTensor(), stack[1].toTensor());
  }
  if (input.numel() == 0) {
    return std::make_tuple(input, at::empty_like(input));
  }
  if (train.has_value() && !*train) {
    return std::make_tuple(input.clone(),
                           at::ones_like(input, input.options().dtype(c10::kBool)));
  }
  const double p1m = 1. - p;
  const double scale = p1m == 0 ? 0. : 1. / p1m;
  // A bool mask in the input's layout, as the CPU, CUDA and meta kernels give.
  at::Tensor mask = at::empty_like(input, input.options().dtype(c10::kBool));
  mask.bernoulli_(p1m);  // flagos generator: reaches the routing path
  at::Tensor output = input.mul(mask).mul_(scale);
  return std::make_tuple(output, mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", TORCH_FN(native_dropout));
}

}  // namespace torch_fl::aten
