#include "aten/native_provider.h"

#include "aten/native_call.h"
#include "aten/native_view.h"
#include "aten/provider_error.h"
#include "aten/python_provider.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

using runtime::kFlagos;

bool is_flagos(const at::Tensor& t) {
  return t.defined() && t.device().type() == kFlagos;
}

// Rewrites the operator's tensor and Device arguments in place: every tensor
// becomes convert(tensor, is_write, in_index_list); a Device argument becomes
// device(d). Generators are left to the caller (they need the device first).
// The replaced values move to `originals`, which keeps the caller's tensors
// alive for the call even when the stack held their only reference.
template <typename Convert, typename DeviceArg>
void translate_arguments(const OpPlan& plan, torch::jit::Stack* stack, size_t base,
                         c10::SmallVector<c10::IValue, 4>& originals, Convert&& convert,
                         DeviceArg&& device) {
  for (const ArgSlot& slot : plan.slots) {
    c10::IValue& v = (*stack)[base + slot.index];
    switch (slot.kind) {
      case ArgKind::kTensor:
        if (!v.isTensor()) break;
        originals.push_back(std::move(v));
        v = convert(originals.back().toTensor(), slot.is_write, false);
        break;
      case ArgKind::kTensorList: {
        if (!v.isTensorList()) break;
        originals.push_back(std::move(v));
        auto in = originals.back().toTensorList();
        c10::List<at::Tensor> out;
        out.reserve(in.size());
        for (const at::Tensor& t : in) out.push_back(convert(t, slot.is_write, false));
        v = std::move(out);
        break;
      }
      case ArgKind::kOptionalTensorList: {
        if (!v.isOptionalTensorList()) break;
        originals.push_back(std::move(v));
        auto in = originals.back().toOptionalTensorList();
        c10::List<std::optional<at::Tensor>> out;
        out.reserve(in.size());
        for (const std::optional<at::Tensor>& t : in) {
          out.push_back(t.has_value()
                            ? std::optional<at::Tensor>(convert(*t, slot.is_write, true))
                            : std::nullopt);
        }
        v = std::move(out);
        break;
      }
      case ArgKind::kDevice:
        if (v.isDevice()) v = c10::IValue(device(v.toDevice()));
        break;
      case ArgKind::kGenerator:
        break;
    }
  }
}

// Replaces the results on the stack by map(result), lists element-wise.
template <typename Map>
void translate_results(const OpPlan& plan, torch::jit::Stack* stack, Map&& map) {
  const size_t ret_base = stack->size() - plan.num_returns;
  for (size_t i = ret_base; i < stack->size(); ++i) {
    c10::IValue& r = (*stack)[i];
    if (r.isTensor()) {
      r = map(r.toTensor());
    } else if (r.isTensorList()) {
      auto in = r.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(in.size());
      for (const at::Tensor& t : in) out.push_back(map(t));
      r = std::move(out);
    }
  }
}

// A flagos tensor argument's native view (NativeCall::arg, written_arg), and
// a result's flagos tensor (NativeCall::result). Written arguments go back
// through NativeCall::sync_written; nothing more to do after the kernel.
struct DenseTensors {
  at::Tensor operator()(NativeCall& call, const at::Tensor& t, bool is_write,
                        bool index_list) const {
    return is_write ? call.written_arg(t) : call.arg(t, index_list);
  }
  void sync(NativeCall&) const {}
  at::Tensor result(NativeCall& call, const at::Tensor& r) const { return call.result(r); }
};

// The same, and nested and sparse tensors: an argument's native twin
// (NativeCall::layout_arg), a result's flagos tensor (layout_result). A tensor
// given twice gets one twin: kernels compare arguments by identity
// (multi-head attention's fused self-attention projection; smm passes its
// output as its input). A written one (`(a!)`: add_, zero_, out=) takes its
// twin's changes after the kernel, and a result that is its twin is the
// argument itself.
struct LayoutTensors {
  std::vector<at::Tensor>& buffers;
  struct Twin {
    c10::TensorImpl* flagos;
    at::Tensor native;
    bool written;
  };
  c10::SmallVector<Twin, 2> twins{};

  at::Tensor operator()(NativeCall& call, const at::Tensor& t, bool is_write, bool index_list) {
    if (t.defined() && NativeViews::has_components(t) && t.device().type() == kFlagos) {
      for (Twin& twin : twins) {
        if (twin.flagos == t.unsafeGetTensorImpl()) {
          twin.written |= is_write;
          return twin.native;
        }
      }
      twins.push_back({t.unsafeGetTensorImpl(), call.layout_arg(t, buffers), is_write});
      return twins.back().native;
    }
    return DenseTensors{}(call, t, is_write, index_list);
  }
  void sync(NativeCall& call) const {
    for (const Twin& twin : twins) {
      if (twin.written) call.sync_written_layout(twin.flagos, twin.native);
    }
  }
  at::Tensor result(NativeCall& call, const at::Tensor& r) const {
    if (!r.defined() || !NativeViews::has_components(r)) return call.result(r);
    for (const Twin& twin : twins) {
      if (twin.written && twin.native.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) {
        return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(twin.flagos));
      }
    }
    return call.layout_result(r);
  }
};

// Runs `kernel` with every flagos argument on the stack replaced by its
// native view, then maps results and written arguments back (NativeCall).
template <typename Kernel, typename Tensors = DenseTensors>
void with_native_views(const c10::OperatorHandle& op, const OpPlan& plan,
                       torch::jit::Stack* stack, bool python_kernel, Kernel&& kernel,
                       Tensors&& tensors = {}) {
  const size_t base = stack->size() - plan.num_arguments;
  c10::SmallVector<c10::IValue, 4> originals;
  NativeCall call(op, python_kernel);
  translate_arguments(
      plan, stack, base, originals,
      [&](const at::Tensor& t, bool is_write, bool index_list) {
        return tensors(call, t, is_write, index_list);
      },
      [&](c10::Device d) { return call.device_arg(d); });
  call.finish_arguments();
  for (const ArgSlot& slot : plan.slots) {
    if (slot.kind != ArgKind::kGenerator) continue;
    c10::IValue& v = (*stack)[base + slot.index];
    std::optional<at::Generator> gen;
    if (v.isGenerator()) gen = v.toGenerator();
    v = c10::IValue(call.generator(gen));
  }
  call.run(kernel);
  call.sync_written();
  tensors.sync(call);
  translate_results(plan, stack, [&](const at::Tensor& r) { return tensors.result(call, r); });
}

// The device the cpu round trip runs for, as the native path finds it.
struct DeviceOf {
  c10::DeviceIndex index = -1;
  const c10::OperatorHandle& op;

  void see(c10::DeviceIndex d) {
    if (index == -1) {
      index = d;
      return;
    }
    TORCH_CHECK(index == d,
                "Expected all tensors to be on the same device, but found at "
                "least two devices, flagos:", static_cast<int>(index),
                " and flagos:", static_cast<int>(d), " (in ",
                op.schema().operator_name(), ")");
  }
};

}  // namespace

void run_native(const c10::OperatorHandle& op, const OpPlan& plan,
                torch::jit::Stack* stack) {
  with_native_views(op, plan, stack, /*python_kernel=*/false, [&] {
    try {
      if (plan.host_kernel != nullptr) {
        plan.host_kernel(op, stack);
      } else {
        op.redispatchBoxed(NativeCall::native_keys(), stack);
      }
    } catch (c10::NotImplementedError& e) {
      TORCH_CHECK_NOT_IMPLEMENTED(
          false, op.schema().operator_name(), " has no ",
          c10::DeviceTypeName(NativeViews::native_type()),
          " kernel for flagos to run on the '", runtime::driver().name(),
          "' driver. Native error: ", e.what_without_backtrace());
    }
  });
}

void run_native_layout(const c10::OperatorHandle& op, const OpPlan& plan,
                       c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  using K = c10::DispatchKey;
  // The layout the dispatcher chose this kernel for: the highest of them.
  const K flagos_key = keys.has(K::NestedTensorPrivateUse1) ? K::NestedTensorPrivateUse1
                       : keys.has(K::SparseCsrPrivateUse1)  ? K::SparseCsrPrivateUse1
                                                            : K::SparsePrivateUse1;
  const c10::DispatchKeySet native_keys(NativeViews::native_key_like(flagos_key));
  std::vector<at::Tensor> buffers;
  with_native_views(
      op, plan, stack, /*python_kernel=*/false,
      [&] {
        try {
          op.redispatchBoxed(native_keys, stack);
        } catch (c10::NotImplementedError& e) {
          const bool nested = flagos_key == K::NestedTensorPrivateUse1;
          TORCH_CHECK_NOT_IMPLEMENTED(
              false, op.schema().operator_name(), ": ",
              nested                                  ? "nested"
              : flagos_key == K::SparsePrivateUse1    ? "sparse COO"
                                                      : "sparse compressed",
              " tensors on flagos run the ", c10::DeviceTypeName(NativeViews::native_type()),
              " kernels for that layout, and there is none for this operator. ",
              nested ? "Pad them into one tensor (.to_padded_tensor(padding))"
                     : "Make them dense (.to_dense())",
              " first. Native error: ", e.what_without_backtrace());
        }
      },
      LayoutTensors{buffers});
}

void run_python(const c10::OperatorHandle& op, const OpPlan& plan,
                torch::jit::Stack* stack, int64_t kernel) {
  if (kernel < 0) kernel = plan.python_kernel.load(std::memory_order_relaxed);
  // The call's own arguments, put back if the kernel raises, for ATen to check
  // (fallback.cpp, run_flaggems): the kernel sees native views in their place.
  // Reference counts only: a Python kernel costs tens of microseconds.
  const size_t base = stack->size() - plan.num_arguments;
  c10::SmallVector<c10::IValue, 8> args(stack->begin() + static_cast<std::ptrdiff_t>(base),
                                        stack->end());
  bool returned = false;  // the kernel ran: what fails after it is torch_fl's mapping
  try {
    with_native_views(op, plan, stack, /*python_kernel=*/true, [&] {
      invoke_python_kernel(kernel, op, stack);
      returned = true;
    });
  } catch (...) {
    if (returned) rethrow_not_about_arguments(std::current_exception());
    stack->resize(base);
    stack->insert(stack->end(), std::make_move_iterator(args.begin()),
                  std::make_move_iterator(args.end()));
    throw;
  }
}

void run_cpu_copy(const c10::OperatorHandle& op, const OpPlan& plan,
                  torch::jit::Stack* stack) {
  const size_t base = stack->size() - plan.num_arguments;
  NativeViews views;
  DeviceOf device{-1, op};
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> written;  // (flagos, cpu)

  c10::SmallVector<c10::IValue, 4> originals;
  translate_arguments(
      plan, stack, base, originals,
      [&](const at::Tensor& t, bool is_write, bool) -> at::Tensor {
        if (!is_flagos(t)) return t;
        device.see(t.device().index());
        at::Tensor cpu = views.to_native(t).to(c10::kCPU);
        if (is_write) written.emplace_back(t, cpu);
        return cpu;
      },
      [&](c10::Device d) {
        if (d.type() != kFlagos) return d;
        device.see(runtime::resolve_device(d.has_index() ? d.index() : -1));
        return c10::Device(c10::kCPU);
      });
  // A flagos generator cannot drive a CPU kernel: CPU's default does.
  for (const ArgSlot& slot : plan.slots) {
    c10::IValue& v = (*stack)[base + slot.index];
    if (slot.kind == ArgKind::kGenerator && v.isGenerator()) v = c10::IValue();
  }
  if (device.index == -1) device.index = runtime::current_device();

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  // Fresh views: a resize below replaces storages the first views point at.
  NativeViews back_views;
  for (auto& [flagos, cpu] : written) {
    if (flagos.sizes() != cpu.sizes()) flagos.resize_(cpu.sizes());
    back_views.to_native(flagos).copy_(cpu);
  }
  auto back = [&](const at::Tensor& r) -> at::Tensor {
    if (!r.defined() || !r.device().is_cpu()) return r;
    for (auto& [flagos, cpu] : written) {
      if (cpu.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return flagos;
    }
    at::Tensor moved = r.to(c10::Device(NativeViews::native_type(), device.index));
    return views.to_flagos(moved, device.index);
  };
  translate_results(plan, stack, back);
}

}  // namespace torch_fl::aten
