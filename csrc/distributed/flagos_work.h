#pragma once

// The Work handle of a flagos collective: the inner backend's Work (gloo's or
// NCCL's, which ran on native views), seen with the caller's flagos tensors.
//
// - wait(), synchronize(), isCompleted() ... forward to the inner Work. On the
//   cuda driver the flagos current stream *is* the CUDA current stream, so
//   NCCL's wait() makes the caller's flagos stream wait for the collective,
//   exactly as it does for CUDA tensors.
// - result() and the future's value are the caller's flagos tensors, never the
//   native views: DDP's Reducer builds its bucket views from that value.
// - The future is a flagos-device future completed from the inner future's
//   callback. Its events are recorded on the flagos stream current in that
//   callback, which on the cuda driver waits for NCCL's events, so its wait()
//   orders the waiter's flagos stream after the collective.

#include <mutex>
#include <optional>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace torch_fl::distributed {

class FlagosWork final : public c10d::Work {
 public:
  FlagosWork(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> outputs,
             std::optional<c10::Device> device, int rank, c10d::OpType op);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = ::kNoTimeout) override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;
  uint64_t getSequencenumber() const override;

 private:
  const c10::intrusive_ptr<c10d::Work> inner_;
  const std::vector<at::Tensor> outputs_;  // flagos tensors; also keep them alive
  const std::optional<c10::Device> device_;
  std::mutex future_mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace torch_fl::distributed
