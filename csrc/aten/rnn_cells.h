#pragma once

namespace torch_fl::aten {

// Registers flagos kernels for the fused LSTM/GRU cell operators (and their
// backward operators), which only CUDA implements. Called once at init on
// the host driver; on the cuda driver those operators route to CUDA's.
void register_host_rnn_cells();

}  // namespace torch_fl::aten
