// all_reduce of sparse COO flagos tensors: DDP's reduction of the gradients
// of nn.Embedding(sparse=True) and EmbeddingBag(sparse=True).
//
// c10d's allreduce_ op has kernels for SparseCPU (gloo's allreduce, which
// allgathers indices and values and sums them) and SparseCUDA (the backend's
// allreduce_sparse, which NCCL refuses) but none for SparsePrivateUse1, where
// flagos' layout route would run the native kernel on twins and never see the
// result. The kernel below passes the call to the flagos backend, as Ops.cpp
// does for the CPU; the backend hands the inner backend native copies (the
// sparse sum reallocates its output anyway) and copies the sum back.
//
// The inner backend does the reduction, so flagos gives what the native
// device gives: on the host driver gloo's sum, bit-equal to CPU tensors over
// gloo; on the cuda driver NCCL's answer for CUDA tensors.

#include "distributed/sparse_allreduce.h"

#include <chrono>

#include <ATen/core/grad_mode.h>
#include <ATen/core/stack.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include "aten/native_view.h"
#include "distributed/flagos_work.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"

namespace torch_fl::distributed {

c10::intrusive_ptr<c10d::Work> sparse_allreduce(c10d::Backend& inner,
                                                std::vector<at::Tensor>& tensors,
                                                const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "flagos backend: all_reduce got no tensors");
  const c10::Device device = tensors[0].device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK_VALUE(t.defined() && t.device().type() == runtime::kFlagos && t.is_sparse(),
                      "flagos backend: all_reduce got tensors[", i, "] ",
                      t.defined() ? t.toString() : "undefined", " on ",
                      t.defined() ? t.device().str() : "no device",
                      " beside sparse COO flagos tensors; one call takes one kind");
    TORCH_CHECK_VALUE(t.device() == device, "flagos backend: all_reduce got tensors[", i,
                      "] on ", t.device(), " while tensors[0] is on ", device,
                      "; one collective runs on one flagos device");
  }
  at::NoGradGuard no_grad;
  const c10::Device native_device = aten::NativeViews::native_device(device.index());
  std::vector<at::Tensor> native;
  native.reserve(tensors.size());
  for (const at::Tensor& t : tensors) native.push_back(t.to(native_device));
  // Ops.cpp's choice for the native device's sparse tensors: gloo takes them
  // in allreduce, NCCL has allreduce_sparse (which raises unless NCCLX).
  c10::intrusive_ptr<c10d::Work> work = runtime::uses_cuda()
                                            ? inner.allreduce_sparse(native, opts)
                                            : inner.allreduce(native, opts);
  // The sum lands in new components of the native copies: it is copied back
  // before the call returns, so the Work is complete (gloo's runs on its own
  // thread otherwise; a caller's wait() then returns at once).
  work->wait();
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(native[i]);
  return c10::make_intrusive<FlagosWork>(std::move(work), tensors, device, inner.getRank(),
                                         c10d::OpType::ALLREDUCE);
}

namespace {

// c10d::allreduce_ for sparse flagos tensors, boxed so that the arguments are
// found by name in every supported release's schema (async_op came later).
void allreduce_sparse_flagos(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const size_t n = schema.arguments().size();
  auto arg = [&](const char* name) -> const c10::IValue* {
    const std::optional<int> index = schema.argumentIndexWithName(name);
    return index ? &(*stack)[stack->size() - n + static_cast<size_t>(*index)] : nullptr;
  };
  std::vector<at::Tensor> tensors = arg("tensors")->toTensorVector();
  const auto group = arg("process_group")->toCustomClass<c10d::ProcessGroup>();
  c10d::AllreduceOptions opts;
  opts.reduceOp = *arg("reduce_op")->toCustomClass<c10d::ReduceOp>();
  opts.timeout = std::chrono::milliseconds(arg("timeout")->toInt());
  if (const c10::IValue* indices = arg("sparse_indices"); indices && !indices->isNone()) {
    opts.sparseIndices = indices->toTensor();
  }
  if (const c10::IValue* async_op = arg("async_op")) opts.asyncOp = async_op->toBool();
  auto work = group->getBackend(c10::DeviceType::PrivateUse1)->allreduce(tensors, opts);
  torch::jit::drop(*stack, n);
  stack->emplace_back(std::move(tensors));
  stack->emplace_back(std::move(work));
}

}  // namespace

TORCH_LIBRARY_IMPL(c10d, SparsePrivateUse1, m) {
  m.impl("allreduce_", torch::CppFunction::makeFromBoxedFunction<&allreduce_sparse_flagos>());
}

}  // namespace torch_fl::distributed
