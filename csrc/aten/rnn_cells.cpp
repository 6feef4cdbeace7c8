// The fused LSTM and GRU cells. PyTorch's RNN code sends every PrivateUse1
// tensor down its GPU path (RNN.cpp: `input.is_privateuseone()`), which
// calls these operators; their only native kernels are CUDA's. On the cuda
// driver they route as usual. On the host driver they are written here in
// flagos operators, with CUDA's formulas and CUDA's workspace layout, so
// that the autograd formulas (which call the *_backward operators below)
// work unchanged.

#include <mutex>

#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "aten/rnn_cells.h"

namespace torch_fl::aten {
namespace {

// input_gates + hidden_gates (+ both biases), as the fused kernels sum them.
at::Tensor summed_gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                        const std::optional<at::Tensor>& input_bias,
                        const std::optional<at::Tensor>& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (input_bias.has_value() && input_bias->defined()) gates = gates + *input_bias;
  if (hidden_bias.has_value() && hidden_bias->defined()) gates = gates + *hidden_bias;
  return gates;
}

at::Tensor or_zeros(const std::optional<at::Tensor>& t, const at::Tensor& like) {
  return t.has_value() && t->defined() ? *t : at::zeros_like(like);
}

// (hy, cy, workspace = [i, f, g, o] after their activations).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
    const std::optional<at::Tensor>& input_bias, const std::optional<at::Tensor>& hidden_bias) {
  auto chunks = summed_gates(input_gates, hidden_gates, input_bias, hidden_bias).chunk(4, 1);
  at::Tensor i = at::sigmoid(chunks[0]), f = at::sigmoid(chunks[1]);
  at::Tensor g = at::tanh(chunks[2]), o = at::sigmoid(chunks[3]);
  at::Tensor cy = f * cx + i * g;
  at::Tensor hy = o * at::tanh(cy);
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

// (grad of the summed gates, grad_cx, grad_bias or undefined).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(
    const std::optional<at::Tensor>& grad_hy, const std::optional<at::Tensor>& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(4, 1);
  const at::Tensor &i = w[0], &f = w[1], &g = w[2], &o = w[3];
  at::Tensor ghy = or_zeros(grad_hy, cy);
  at::Tensor tanh_cy = at::tanh(cy);
  at::Tensor gcx = ghy * o * (1 - tanh_cy * tanh_cy) + or_zeros(grad_cy, cy);
  at::Tensor grad_gates = at::cat({gcx * g * (1 - i) * i, gcx * cx * (1 - f) * f,
                                   gcx * i * (1 - g * g), ghy * tanh_cy * (1 - o) * o},
                                  1);
  at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, gcx * f, grad_bias};
}

// (hy, workspace = [r, z, n, hx, hidden n gate (+ its bias)]).
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates,
                                            const at::Tensor& hidden_gates, const at::Tensor& hx,
                                            const std::optional<at::Tensor>& input_bias,
                                            const std::optional<at::Tensor>& hidden_bias) {
  auto in = (input_bias.has_value() && input_bias->defined() ? input_gates + *input_bias
                                                             : input_gates)
                .chunk(3, 1);
  auto hn = (hidden_bias.has_value() && hidden_bias->defined() ? hidden_gates + *hidden_bias
                                                               : hidden_gates)
                .chunk(3, 1);
  at::Tensor r = at::sigmoid(in[0] + hn[0]), z = at::sigmoid(in[1] + hn[1]);
  at::Tensor n = at::tanh(in[2] + r * hn[2]);
  at::Tensor hy = n + z * (hx - n);
  return {hy, at::cat({r, z, n, hx, hn[2]}, 1)};
}

// (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const at::Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &hn = w[4];
  at::Tensor gz = grad_hy * (hx - n) * (1 - z) * z;
  at::Tensor gn = grad_hy * (1 - z) * (1 - n * n);
  at::Tensor gr = gn * hn * (1 - r) * r;
  at::Tensor grad_input = at::cat({gr, gz, gn}, 1);
  at::Tensor grad_hidden = at::cat({gr, gz, gn * r}, 1);
  at::Tensor bi = has_bias ? grad_input.sum(0) : at::Tensor();
  at::Tensor bh = has_bias ? grad_hidden.sum(0) : at::Tensor();
  return {grad_input, grad_hidden, grad_hy * z, bi, bh};
}

}  // namespace

void register_host_rnn_cells() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                          c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    lib->impl("_thnn_fused_lstm_cell", TORCH_FN(lstm_cell));
    lib->impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstm_cell_backward));
    lib->impl("_thnn_fused_gru_cell", TORCH_FN(gru_cell));
    lib->impl("_thnn_fused_gru_cell_backward", TORCH_FN(gru_cell_backward));
  });
}

}  // namespace torch_fl::aten
