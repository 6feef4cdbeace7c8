#pragma once

// SyncBatchNorm's operators on the host driver. PyTorch's SyncBatchNorm runs
// on every accelerator, flagos included (torch/nn/modules/_functions.py), and
// calls operators that only CUDA implements: per-replica statistics,
// their combination across replicas, the normalisation, and the two halves of
// its backward. The CPU has no kernels for them, so the host driver's are
// written here, in ATen operators on the native (CPU) views, computing what
// CUDA's kernels (aten/src/ATen/native/cuda/Normalization.cu) compute: the
// statistics in float for half-precision inputs, the input's dtype for the
// normalised output and the input gradient.

#include "aten/host_parity.h"

namespace torch_fl::aten {

// The host kernel for one of those operators, or nullptr.
HostKernel sync_batch_norm_kernel(const c10::OperatorName& name);

}  // namespace torch_fl::aten
