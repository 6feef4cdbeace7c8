#pragma once

// all_reduce of sparse COO flagos tensors (sparse_allreduce.cpp).

#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace torch_fl::distributed {

// Runs the inner backend's own sparse all_reduce on native copies of
// `tensors` and copies the sum back into them; returns a completed Work.
c10::intrusive_ptr<c10d::Work> sparse_allreduce(c10d::Backend& inner,
                                                std::vector<at::Tensor>& tensors,
                                                const c10d::AllreduceOptions& opts);

}  // namespace torch_fl::distributed
