#pragma once

// One call of a native kernel (PyTorch's CPU or CUDA kernel) on flagos
// arguments: what the boxed routing kernel and the unboxed routes share, so
// that both give the same results and the same errors.
//
// Use, in this order:
//  1. arg() / written_arg() / device_arg() for every argument: flagos tensors
//     become native views (NativeViews), flagos Devices the native device;
//     the flagos device of the call is found on the way;
//  2. finish_arguments(): the device check for non-flagos tensors, and the
//     current device when no argument named one;
//  3. generator() for Generator arguments (they need the device);
//  4. run(kernel): on the call's device, with allocations captured as flagos
//     memory (NativeAllocationScope); or run_self_guarded(kernel) for a
//     kernel that sets the device itself;
//  5. sync_written(), then result() for each returned tensor.

#include <optional>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/SmallVector.h>

#include "aten/native_view.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"

namespace torch_fl::aten {

class NativeCall {
 public:
  // `python_kernel`: the kernel is a Python callable (flaggems provider); its
  // views must not come from or go to the per-thread view cache.
  explicit NativeCall(const c10::OperatorHandle& op, bool python_kernel = false) noexcept
      : op_(op), views_(!python_kernel) {}

  // Tensors passed to arg() and written_arg() must outlive the call: only
  // their addresses are kept (see NativeViews::to_native).

  // A tensor argument the kernel only reads: its native view, or `t` itself
  // when it is no flagos tensor. Valid until the next argument is converted
  // (NativeViews::view_of): copy it, or borrow it at once (c10::MaybeOwned),
  // which is what the unboxed routes do to spare a reference count. `index_list`:
  // an element of a Tensor?[] index list, where CUDA accepts CPU tensors among
  // device ones.
  const at::Tensor& arg(const at::Tensor& t, bool index_list = false) {
    if (!t.defined()) return t;
    if (t.device().type() != runtime::kFlagos) {
      foreign_.emplace_back(t.unsafeGetTensorImpl(), index_list);
      return t;
    }
    see(t.device().index());
    tensor_named_device_ = true;
    return views_.view_of(t);
  }

  // A nested or sparse flagos tensor argument (a NestedTensorPrivateUse1,
  // SparsePrivateUse1 or SparseCsrPrivateUse1 call): its native twin (NativeViews::layout_view_of);
  // `buffers` outlives the call.
  at::Tensor layout_arg(const at::Tensor& t, std::vector<at::Tensor>& buffers) {
    see(t.device().index());
    tensor_named_device_ = true;
    return views_.layout_view_of(t, buffers);
  }
  // Room for a list argument of `n` tensors, before its elements go to arg().
  void reserve(size_t n) { views_.reserve(n); }

  // A tensor argument the kernel may write or resize (schema `(a!)`).
  at::Tensor written_arg(const at::Tensor& t) {
    at::Tensor native = arg(t);
    if (t.defined() && t.device().type() == runtime::kFlagos) {
      written_.emplace_back(t.unsafeGetTensorImpl(), native);
    }
    return native;
  }

  // A Device argument: a flagos device names the call's device and becomes
  // the native device type.
  c10::Device device_arg(c10::Device d) {
    if (d.type() != runtime::kFlagos) return d;
    see(runtime::resolve_device(d.has_index() ? d.index() : -1));
    return c10::Device(NativeViews::native_type());
  }

  void finish_arguments();

  // The native generator for a Generator argument (the flagos device's
  // default when none is given). A flagos generator is refused for a call
  // that has no flagos tensor or device (a CPU tensor's, as CUDA's is).
  at::Generator generator(const std::optional<at::Generator>& gen) const;

  template <class Kernel>
  decltype(auto) run(Kernel&& kernel) {
    const auto guard = runtime::guard_unless_current(device_);
    runtime::NativeAllocationScope scope(device_);
    return kernel();
  }

  // run() for a kernel that makes the device of its tensor arguments current
  // itself: a PyTorch kernel registered for the native device, whose
  // generated wrapper guards the device (on the host driver, the CPU has
  // none). A call whose device no tensor named (device_arg() alone) is
  // guarded here. Skipping our guard skips reading the current device, a
  // driver call (cudaGetDevice) on every routed operator.
  template <class Kernel>
  decltype(auto) run_self_guarded(Kernel&& kernel) {
    if (!tensor_named_device_) return run(std::forward<Kernel>(kernel));
    runtime::NativeAllocationScope scope(device_);
    return kernel();
  }

  // Carries a resize or restride the kernel did on a written view over to
  // its flagos tensor.
  void sync_written() {
    for (auto& [flagos, native] : written_) views_.sync_back(flagos, native);
  }

  // The flagos tensor for a tensor the kernel returned (see NativeViews).
  at::Tensor result(const at::Tensor& native) { return views_.to_flagos(native, device_); }
  // The same for a nested or sparse one (NativeViews::layout_to_flagos).
  at::Tensor layout_result(const at::Tensor& native) {
    return views_.layout_to_flagos(native, device_);
  }
  // After the kernel: a written nested or sparse argument takes its twin's
  // changes (NativeViews::layout_sync_back).
  void sync_written_layout(c10::TensorImpl* flagos, const at::Tensor& twin) {
    views_.layout_sync_back(flagos, twin, device_);
  }

  // The dispatch key of the native kernels.
  static c10::DispatchKeySet native_keys() noexcept;

 private:
  void see(c10::DeviceIndex d) {
    if (device_ == -1) {
      device_ = d;
    } else if (device_ != d) {
      mismatch(d);
    }
  }
  [[noreturn]] void mismatch(c10::DeviceIndex d) const;

  const c10::OperatorHandle& op_;
  NativeViews views_;
  c10::DeviceIndex device_ = -1;
  bool tensor_named_device_ = false;  // a flagos tensor argument set device_
  bool no_flagos_argument_ = false;   // device_ is the current device: no argument named one
  c10::SmallVector<std::pair<c10::TensorImpl*, at::Tensor>, 2> written_;  // (flagos, view)
  c10::SmallVector<std::pair<c10::TensorImpl*, bool>, 2> foreign_;  // (tensor, index_list)
};

}  // namespace torch_fl::aten
