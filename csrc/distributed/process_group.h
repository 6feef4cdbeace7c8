#pragma once

// ProcessGroupFlagos: the c10d backend of the flagos device, registered with
// torch.distributed as "flagos" (docs/distributed.md).
//
// It is a bridge, not a communication library: every collective checks its
// flagos tensors, makes zero-copy native views of them (CommViews) and runs
// the *inner* backend on those views: gloo on the host driver (CPU views),
// NCCL on the cuda driver (CUDA views). The inner backend is built by the
// Python creator (torch_fl/distributed.py), so this file needs neither gloo's
// nor NCCL's headers. The returned Work hands back the caller's flagos tensors
// (FlagosWork).
//
// Reduce ops: every op the inner backend supports passes through (gloo and
// NCCL both take AVG). PREMUL_SUM, which gloo lacks, is applied to the inputs
// before a SUM; for NCCL a flagos factor tensor becomes a native view.

#include <chrono>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "runtime/version.h"

namespace torch_fl::distributed {

class ProcessGroupFlagos final : public c10d::Backend {
 public:
  static constexpr const char* kName = "flagos";

  ProcessGroupFlagos(c10::intrusive_ptr<c10d::Backend> inner, int rank, int size,
                     std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  const c10::intrusive_ptr<c10d::Backend>& inner() const { return inner_; }

  bool supportsSplitting() const override { return false; }
  bool supportsCoalescing() const override { return inner_->supportsCoalescing(); }
  void startCoalescing() override { inner_->startCoalescing(); }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
#if FLAGOS_TORCH_AT_LEAST(2, 13)  // not checked against 2.11's Backend
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif
  uint64_t getSequenceNumberForGroup() override { return inner_->getSequenceNumberForGroup(); }
  void abort() override { inner_->abort(); }
  void shutdown() override { inner_->shutdown(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank,
                                      int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    inner_->monitoredBarrier(opts, wait_all_ranks);
  }

 private:
  // The inner backend's work as a FlagosWork handing back `outputs`.
  c10::intrusive_ptr<c10d::Work> wrap(c10::intrusive_ptr<c10d::Work> inner,
                                      std::vector<at::Tensor> outputs,
                                      std::optional<c10::Device> device, c10d::OpType op) const;

  const c10::intrusive_ptr<c10d::Backend> inner_;
  const bool inner_has_premul_sum_;
  c10::intrusive_ptr<Options> options_;
};

}  // namespace torch_fl::distributed
