// Copies into, out of and between flagos devices. PyTorch's copy_ sends every
// copy that involves a flagos tensor here: copy_ handles only its own device
// types, and redispatches the rest as _copy_from(src, dst), whose dispatch key
// comes from both tensors; PrivateUse1 outranks CPU and CUDA, so flagos gets
// cuda -> flagos and flagos -> cuda copies as well. The copy itself runs as
// the native device's copy_ over zero-copy native views, which already
// handles dtype conversion, strides, broadcasting, overlap and, on GPUs,
// non_blocking copies on the current streams. On the cuda driver a copy with
// a cuda tensor is therefore CUDA's own device-to-device (or peer) copy.

#include <ATen/core/Tensor.h>
#include <ATen/ops/_to_copy_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/copy_compositeexplicitautograd_dispatch.h>
#include <ATen/ops/copy_ops.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include "aten/native_call.h"
#include "aten/native_view.h"
#include "aten/own_kernels.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/version.h"

namespace torch_fl::aten {
namespace {

using runtime::kFlagos;

bool is_flagos(const at::Tensor& t) { return t.device().type() == kFlagos; }

// The device types flagos copies to and from: flagos, the CPU, and the
// driver's native device when that is not the CPU (cuda on the cuda driver).
bool copies_with(c10::DeviceType type) {
  return type == kFlagos || type == c10::DeviceType::CPU || type == NativeViews::native_type();
}

void check_other_side(const at::Tensor& t, const char* direction) {
  const c10::DeviceType type = t.device().type();
  if (copies_with(type)) return;
  if (type == c10::DeviceType::CUDA) {
    TORCH_CHECK(false, "copy ", direction, " flagos: cannot copy directly between flagos and a ",
                t.device(), " tensor on the ", runtime::driver().name(),
                " driver, whose memory is not CUDA memory; copy through the CPU (.cpu()) ",
                "or run the cuda driver (FLAGOS_ACCELERATOR=cuda)");
  }
  TORCH_CHECK(false, "copy ", direction, " flagos: cannot copy directly between flagos and a ",
              t.device(), " tensor; flagos copies to and from cpu and flagos tensors",
              NativeViews::native_type() == c10::DeviceType::CUDA ? " and cuda tensors" : "",
              " (move it to the CPU first)");
}

// The copy of `self` into `dst`, both on devices flagos copies with.
void copy_checked(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  runtime::lazy_init();
  const at::Tensor& device_side = is_flagos(dst) ? dst : self;
  const c10::DeviceIndex device = device_side.device().index();
  // Every dtype conversion (`.to(dtype)`, autocast's casts) lands here, so
  // the call is kept as lean as a routed operator's: the device is switched
  // only when it is not current, and the views come from the thread's cache.
  const auto guard = runtime::guard_unless_current(device);
  NativeViews views(/*reuse_views=*/true);
  at::Tensor native_dst = is_flagos(dst) ? views.to_native(dst) : dst;
  at::Tensor native_src = is_flagos(self) ? views.to_native(self) : self;
  {
    runtime::NativeAllocationScope scope(device);
    // copy_ is one CompositeExplicitAutograd kernel for every dense device;
    // the call already passed autograd, so the native copy is called below it.
    at::_ops::copy_::redispatch(NativeCall::native_keys(), native_dst, native_src,
                                non_blocking);
  }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_other_side(self, "to");
  check_other_side(dst, "from");
  copy_checked(self, dst, non_blocking);
  return dst;
}

// copy_ with a flagos side: PyTorch's composite copy_ would check the pair,
// then dispatch _copy_from, which lands in copy_from above; the native copy_
// it runs makes the same checks on the native views (same data, overlap,
// dtypes), so the pair goes to copy_checked directly. Backward passes copy
// gradients into slices (slice, select and expand backward) hundreds of times
// a step. What the composite handles and native views would lose (names, zero
// tensors, quantized tensors, a third device type such as meta) keeps it.
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const auto direct = [](const at::Tensor& t) {
#if FLAGOS_TORCH_HAS_NAMED_TENSORS
    if (t.has_names()) return false;
#endif
    return copies_with(t.device().type()) && !t._is_zerotensor() && !t.is_quantized();
  };
  if (!self.defined() || !src.defined() || !direct(self) || !direct(src)) {
    return at::compositeexplicitautograd::copy_(self, src, non_blocking);
  }
  copy_checked(src, self, non_blocking);
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) dst.resize_(self.sizes());
  return copy_from(self, dst, /*non_blocking=*/false);
}

// `.to(dtype)`, `.to(memory_format=...)`, `.clone()`-like conversions and
// autocast's casts: a flagos tensor converted to a flagos tensor on its own
// device. PyTorch's composite kernel would make an empty flagos tensor and
// copy into it through copy_ and _copy_from (three dispatches, a native view
// of the new tensor); the native device's own _to_copy on the native view
// runs the same copy kernel, and its result is adopted as it comes. Every
// other conversion (to another device or layout, pinned) keeps the composite.
at::Tensor to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                   std::optional<at::Layout> layout, std::optional<at::Device> device,
                   std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<at::MemoryFormat> memory_format) {
  // A cpu or cuda `self` converted to flagos is dispatched here too (the
  // target device counts): a copy across devices, which the composite hands
  // to _copy_from.
  const bool same_device =
      is_flagos(self) &&
      (!device.has_value() || (device->type() == kFlagos && device->has_index() &&
                               device->index() == self.device().index()));
  if (!same_device || layout.value_or(at::kStrided) != at::kStrided || pin_memory.value_or(false)) {
    return at::compositeexplicitautograd::_to_copy(self, dtype, layout, device, pin_memory,
                                                   non_blocking, memory_format);
  }
  static const c10::OperatorHandle& op = *new c10::OperatorHandle(
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_to_copy", ""));
  NativeCall call(op);
  at::Tensor native = call.arg(self);
  call.finish_arguments();
  at::Tensor r = call.run([&] {
    return at::_ops::_to_copy::redispatch(NativeCall::native_keys(), native, dtype, layout,
                                          std::nullopt, std::nullopt, non_blocking, memory_format);
  });
  return call.result(r);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  impl_own(m, "_to_copy", TORCH_FN(to_copy));
  impl_own(m, "copy_", TORCH_FN(copy_));
  impl_own(m, "_copy_from", TORCH_FN(copy_from));
  impl_own(m, "_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
}

// The conjugate and negative-view fallbacks would materialise a lazily
// conjugated source by cloning it, and the clone copies through _copy_from
// again: endless recursion. The native copy_ understands both bits (native
// views carry them), so these copies pass straight through.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torch_fl::aten
