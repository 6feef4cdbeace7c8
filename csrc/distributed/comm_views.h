#pragma once

// Zero-copy native views for collectives: a tensor of the driver's native
// device type (CPU on the host driver, CUDA on the cuda driver) over the same
// bytes as a flagos tensor, which the inner backend (gloo, NCCL) can take.
//
// Unlike the per-operator NativeViews (aten/native_view.h), a comm view owns a
// reference to the flagos storage: inner backends keep their tensors past the
// call (gloo's work queue, NCCL's stash until the collective has run), so the
// memory must live as long as any of their copies does.
//
// One CommViews object serves one collective call. It checks that every
// tensor is a flagos tensor and that all of them are on one flagos device,
// naming the culprit otherwise; flagos tensors sharing a storage get views
// sharing one native storage.

#include <optional>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

namespace torch_fl::distributed {

class CommViews {
 public:
  // `op` names the collective in error messages ("all_reduce").
  explicit CommViews(std::string_view op) : op_(op) {}

  // The native view of `flagos`; `what` names the argument ("tensors[0]").
  at::Tensor view(const at::Tensor& flagos, std::string_view what);
  std::vector<at::Tensor> view(const std::vector<at::Tensor>& flagos,
                               std::string_view what);
  std::vector<std::vector<at::Tensor>> view(
      const std::vector<std::vector<at::Tensor>>& flagos, std::string_view what);

  // The flagos device every checked tensor is on (none when there were none).
  std::optional<c10::Device> device() const { return device_; }

 private:
  at::Tensor view_at(const at::Tensor& flagos, std::string_view what, int64_t i, int64_t j);
  void check(const at::Tensor& t, std::string_view what, int64_t i, int64_t j);

  std::string_view op_;
  std::optional<c10::Device> device_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages_;
};

}  // namespace torch_fl::distributed
