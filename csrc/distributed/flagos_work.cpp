#include "distributed/flagos_work.h"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

namespace torch_fl::distributed {

FlagosWork::FlagosWork(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> outputs,
                       std::optional<c10::Device> device, int rank, c10d::OpType op)
    : c10d::Work(rank, op),
      inner_(std::move(inner)),
      outputs_(std::move(outputs)),
      device_(device) {}

bool FlagosWork::isCompleted() { return inner_->isCompleted(); }
bool FlagosWork::isSuccess() const { return inner_->isSuccess(); }
std::exception_ptr FlagosWork::exception() const { return inner_->exception(); }
int FlagosWork::sourceRank() const { return inner_->sourceRank(); }
std::vector<at::Tensor> FlagosWork::result() { return outputs_; }
void FlagosWork::synchronize() { inner_->synchronize(); }
bool FlagosWork::wait(std::chrono::milliseconds timeout) { return inner_->wait(timeout); }
void FlagosWork::abort() { inner_->abort(); }
float FlagosWork::getDuration() const { return inner_->getDuration(); }
uint64_t FlagosWork::getSequencenumber() const { return inner_->getSequencenumber(); }

c10::intrusive_ptr<c10::ivalue::Future> FlagosWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (future_) return future_;
  // Throws as the inner backend does for works without a future (gloo's p2p).
  c10::intrusive_ptr<c10::ivalue::Future> inner = inner_->getFuture();
  std::vector<c10::Device> devices;
  if (device_) devices.push_back(*device_);
  future_ = c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::create(c10::TensorType::get()), std::move(devices));
  // Runs on gloo's worker thread when the collective finishes, or at once for
  // NCCL (whose future completes at enqueue, carrying CUDA events): then the
  // current stream is one that waits for those events (ivalue::Future's
  // callback contract), and the flagos future records its events there.
  inner->addCallback([future = future_, outputs = outputs_](c10::ivalue::Future& done) {
    if (done.hasError()) {
      future->setError(done.exception_ptr());
      return;
    }
    try {
      future->markCompleted(c10::IValue(outputs));
    } catch (...) {
      if (!future->completed()) future->setError(std::current_exception());
    }
  });
  return future_;
}

}  // namespace torch_fl::distributed
