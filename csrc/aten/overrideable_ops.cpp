// Convolution, which PyTorch sends down a special path for backends other
// than its own, where the boxed routing kernel is never reached: _convolution
// calls convolution_overrideable (and autograd convolution_backward_overrideable)
// for PrivateUse1, and their only kernels are stubs that throw. Here they run
// the native device's convolution over native views. (Attention's special
// path is in attention.cpp.)

#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "aten/native_view.h"
#include "runtime/native_allocation.h"

namespace torch_fl::aten {
namespace {

// The native convolution checks that its tensors share a device; here the
// views would all be native tensors, so flagos checks first, as CUDA would.
void check_same_device(const at::Tensor& ref, const at::Tensor& t, const char* what) {
  if (!t.defined()) return;
  TORCH_CHECK(t.device() == ref.device(), "Expected all tensors to be on the same device, "
              "but found at least two devices, ", ref.device(), " and ", t.device(),
              "! (convolution ", what, ")");
}

std::optional<at::Tensor> native_opt(NativeViews& v, const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return t;
  return v.to_native(*t);
}

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias,
                                    c10::IntArrayRef stride, c10::IntArrayRef padding,
                                    c10::IntArrayRef dilation, bool transposed,
                                    c10::IntArrayRef output_padding, int64_t groups) {
  check_same_device(input, weight, "weight");
  if (bias.has_value()) check_same_device(input, *bias, "bias");
  const auto device = input.device().index();
  c10::DeviceGuard guard(input.device());
  NativeViews views;
  at::Tensor out;
  {
    runtime::NativeAllocationScope scope(device);
    out = at::convolution(views.to_native(input), views.to_native(weight),
                          native_opt(views, bias), stride, padding, dilation,
                          transposed, output_padding, groups);
  }
  return views.to_flagos(out, device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  check_same_device(input, weight, "weight");
  check_same_device(input, grad_output, "grad_output");
  const auto device = input.device().index();
  c10::DeviceGuard guard(input.device());
  NativeViews views;
  // The bias gradient sums grad_output over every dim but the channel one.
  std::optional<std::vector<int64_t>> bias_sizes;
  if (output_mask[2]) bias_sizes = std::vector<int64_t>{grad_output.size(1)};
  std::tuple<at::Tensor, at::Tensor, at::Tensor> r;
  {
    runtime::NativeAllocationScope scope(device);
    r = at::convolution_backward(
        views.to_native(grad_output), views.to_native(input), views.to_native(weight),
        bias_sizes ? at::OptionalIntArrayRef(*bias_sizes) : at::OptionalIntArrayRef(),
        stride, padding, dilation, transposed, output_padding, groups, output_mask);
  }
  return {views.to_flagos(std::get<0>(r), device), views.to_flagos(std::get<1>(r), device),
          views.to_flagos(std::get<2>(r), device)};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution_overrideable));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_overrideable));
}

}  // namespace torch_fl::aten
