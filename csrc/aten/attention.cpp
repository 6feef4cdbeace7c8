// Fused scaled-dot-product attention on flagos.
//
// scaled_dot_product_attention (ATen/native/transformers/attention.cpp) asks
// _fused_sdp_choice_stub for the device's choice (a DispatchStub; without a
// PrivateUse1 entry it silently means the math path), then calls the chosen
// operator on the caller's tensors:
//  - math, memory-efficient (_scaled_dot_product_efficient_attention) and
//    cuDNN (_scaled_dot_product_cudnn_attention) are ordinary operators with
//    autograd formulas: on flagos they and their backward operators reach the
//    boxed routing path, which runs the native device's kernels over views;
//  - flash: for any device but CUDA, attention.cpp calls the CPU flash
//    operator. So on the cuda driver flagos answers "overrideable" instead,
//    and implements _scaled_dot_product_fused_attention_overrideable and its
//    backward with CUDA's flash operators, padding the head dimension as
//    attention.cpp's CUDA branch does and carrying the RNG state through.
//
// The choice is the native device's (CPU's on the host driver, CUDA's on the
// cuda driver), asked from its own selector, so that every sdpa_kernel
// setting, dtype, mask, GQA and dropout case picks what that device picks.

#include <array>
#include <optional>
#include <tuple>
#include <vector>

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward.h>
#include <ATen/ops/pad.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include "aten/native_view.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/storage.h"

namespace torch_fl::aten {
namespace {

using at::SDPBackend;
using runtime::kFlagos;

// ---- the choice -------------------------------------------------------------

// A native view of a flagos tensor; other tensors (CPU scalars some kernels
// return) pass as they are.
at::Tensor native(NativeViews& views, const at::Tensor& t) {
  return t.defined() && t.device().type() == kFlagos ? views.to_native(t) : t;
}

// A tensor of the native device type with the metadata of flagos tensor `t`
// (sizes, strides, offset, dtype, requires_grad) over the same address, for
// the native device's selector: CUDA's rejects any other device type, reads
// metadata and, in some releases, data-pointer alignment. A tensor without
// memory of its own (a FakeTensor, a functional wrapper while tracing) gets a
// null address, so the choice is made from metadata alone, as PyTorch's own
// meta choice does for CUDA FakeTensors.
at::Tensor native_shell(const at::Tensor& t) {
  // A tensor of another device (a CPU mask) is shown as it is, as the native
  // device's selector would see it beside native tensors.
  if (!t.defined() || t.device().type() != kFlagos) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  void* data = nullptr;
  size_t nbytes = 0;
  if (impl->has_storage()) {
    c10::StorageImpl* storage = impl->unsafe_storage().unsafeGetStorageImpl();
    const c10::DataPtr& dp = storage->_mutable_data_ptr_no_checks();
    const std::optional<int64_t> size = storage->sym_nbytes().maybe_as_int();
    if (dp.device().type() == kFlagos && size.has_value()) {
      data = dp.get();
      nbytes = static_cast<size_t>(*size);
    }
  }
  const c10::Device device = NativeViews::native_device(t.device().index());
  c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, c10::DataPtr(data, device),
      /*allocator=*/nullptr, /*resizable=*/false));
  auto shell = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage),
      c10::DispatchKeySet(NativeViews::native_key()),
      t.dtype());
  shell->set_sizes_and_strides(t.sym_sizes(), t.sym_strides(), t.sym_storage_offset());
  at::Tensor out(std::move(shell));
  // The choice depends on which inputs require grad (a fused kernel with no
  // derivative for a learned mask, T5's position bias, must not be picked).
  if (t.requires_grad()) out.set_requires_grad(true);
  return out;
}

// Whether the selector may see `t` as the thread's cached native view (the one
// the chosen kernel is then called with) instead of a shell made for the
// choice: a dense flagos tensor over flagos memory that needs no grad (a view
// carries no autograd state). Saves a StorageImpl and a TensorImpl per input.
bool viewable(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kFlagos) return true;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !t.requires_grad() && impl->has_storage() &&
         runtime::FlagosStorage::twin_of(impl->unsafe_storage().unsafeGetStorageImpl()) !=
             nullptr &&
         !impl->key_set().has_any(c10::DispatchKeySet(
             {c10::DispatchKey::Python, c10::DispatchKey::Functionalize}));
}

// The native device's own selector over native tensors: the operator's CPU or
// CUDA kernel is the function attention.cpp reaches through the stub for
// tensors of that device, and it raises that device's error when every
// allowed backend is ruled out. (Calling the stub itself from here is not
// ABI-safe: its inline call path depends on capability macros of torch's own
// build.) A Python dispatch mode (FakeTensor tracing) must not see it or the
// metadata-only operations it may run (2.14 unsqueezes unbatched inputs).
int64_t native_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double dropout_p,
                          bool is_causal, std::optional<double> scale, bool enable_gqa) {
  c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

// Strided nested (torch.nested) inputs: the native selector sees their native
// nested twins, so the host driver picks what the CPU picks (math: the CPU's
// flash kernel takes no nested tensors) and raises where the CPU raises (math
// turned off). The chosen operator then runs on the nested flagos tensors, op
// by op on the layout route. CUDA's flash choice cannot be honoured: for a
// device other than CUDA, attention.cpp sends flash to the CPU's dense kernel,
// and the overrideable operator has no nested form, so the cuda driver takes
// the math path there (CUDA's own kernels, not its fused nested one).
int64_t nested_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const std::optional<at::Tensor>& mask, double dropout_p,
                          bool is_causal, std::optional<double> scale, bool enable_gqa) {
  NativeViews views;
  std::vector<at::Tensor> buffers;
  auto twin = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kFlagos) return t;
    at::Tensor out = t.is_nested() ? views.layout_view_of(t, buffers) : views.to_native(t);
    // Views carry no autograd state; the choice depends on which inputs need grad.
    if (t.requires_grad()) out = out.detach().requires_grad_(true);
    return out;
  };
  std::optional<at::Tensor> native_mask;
  if (mask.has_value() && mask->defined()) native_mask = twin(*mask);
  const int64_t choice = native_sdp_choice(twin(q), twin(k), twin(v), native_mask, dropout_p,
                                           is_causal, scale, enable_gqa);
  if (choice != static_cast<int64_t>(SDPBackend::flash_attention)) return choice;
  TORCH_CHECK(at::globalContext().userEnabledMathSDP(),
              "scaled_dot_product_attention: for nested (torch.nested) inputs the native device "
              "chose flash attention, which flagos runs for dense inputs only; it would take the "
              "math path instead, but that is turned off (torch.nn.attention.sdpa_kernel). Allow "
              "SDPBackend.MATH, or pad the inputs into one tensor (.to_padded_tensor(padding)).");
  return static_cast<int64_t>(SDPBackend::math);
}

int64_t fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const std::optional<at::Tensor>& mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (q.is_nested() || k.is_nested() || v.is_nested()) {
    return nested_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
  }
  const bool has_mask = mask.has_value() && mask->defined();
  // Eager calls on real tensors (every decode step) show the selector the
  // cached views; tracing and inputs that need grad, shells.
  const bool views_ok =
      viewable(q) && viewable(k) && viewable(v) && (!has_mask || viewable(*mask));
  NativeViews views(/*reuse_views=*/true);
  auto native_input = [&](const at::Tensor& t) {
    return views_ok ? native(views, t) : native_shell(t);
  };
  std::optional<at::Tensor> native_mask;
  if (has_mask) native_mask = native_input(*mask);
  const int64_t choice = native_sdp_choice(native_input(q), native_input(k), native_input(v),
                                           native_mask, dropout_p, is_causal, scale, enable_gqa);
  // For any device but CUDA, attention.cpp's flash case runs the CPU flash
  // operator: right on the host driver; on the cuda driver flagos runs CUDA's
  // flash through the overrideable operator (below).
  if (runtime::uses_cuda() && choice == static_cast<int64_t>(SDPBackend::flash_attention)) {
    return static_cast<int64_t>(SDPBackend::overrideable);
  }
  return choice;
}

// ---- flash attention through the overrideable operator (cuda driver) -------

void check_flash_call(const char* op, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, bool has_bias) {
  TORCH_CHECK(runtime::uses_cuda(), op, ": flagos runs it with CUDA's flash attention, on the "
              "cuda driver only (this process runs the ", runtime::driver().name(), " driver)");
  TORCH_CHECK(!has_bias, op, ": flagos runs it with CUDA's flash attention, which takes no "
              "attention mask (scaled_dot_product_attention picks flash only without one)");
  for (const at::Tensor* t : {&k, &v}) {
    TORCH_CHECK(t->device() == q.device(), op, ": expected query, key and value on one device, "
                "but found ", q.device(), " and ", t->device());
  }
}

// attention.cpp's CUDA branch pads the head dimension of flash inputs to a
// multiple of 8 (pad_last_dim<8, false>) and slices the output back.
constexpr int64_t kFlashHeadDimAlignment = 8;

at::Tensor pad_head_dim(const at::Tensor& t) {
  if (!t.defined()) return t;
  const int64_t rest = t.size(-1) % kFlashHeadDimAlignment;
  if (rest == 0) return t;
  return at::pad(t, {0, kFlashHeadDimAlignment - rest});
}

at::Tensor unpad_head_dim(const at::Tensor& t, int64_t head_dim) {
  if (!t.defined() || t.size(-1) == head_dim) return t;
  return t.slice(-1, 0, head_dim);
}

using FusedAttentionOut = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
                                     c10::SymInt, at::Tensor, at::Tensor, at::Tensor>;

FusedAttentionOut fused_attention_overrideable(const at::Tensor& query, const at::Tensor& key,
                                               const at::Tensor& value,
                                               const std::optional<at::Tensor>& attn_bias,
                                               double dropout_p, bool is_causal,
                                               bool return_debug_mask,
                                               std::optional<double> scale) {
  check_flash_call("_scaled_dot_product_fused_attention_overrideable", query, key, value,
                   attn_bias.has_value() && attn_bias->defined());
  const auto device = query.device().index();
  const auto guard = runtime::guard_unless_current(device);
  NativeViews views(/*reuse_views=*/true);
  const at::Tensor q = native(views, query);
  const int64_t head_dim = q.size(-1);
  // The scale comes from the unpadded head dimension, as in attention.cpp.
  const double softmax_scale = sdp::calculate_scale(q, scale).guard_float(__FILE__, __LINE__);
  at::Tensor out, lse, cum_q, cum_k, rng_state, unused, debug_mask;
  c10::SymInt max_q, max_k;
  {
    runtime::NativeAllocationScope scope(device);
    std::tie(out, lse, cum_q, cum_k, max_q, max_k, rng_state, unused, debug_mask) =
        at::_scaled_dot_product_flash_attention(
            pad_head_dim(q), pad_head_dim(native(views, key)),
            pad_head_dim(native(views, value)), dropout_p, is_causal, return_debug_mask,
            softmax_scale);
  }
  // Flash's rng_state and unused outputs travel in the philox_seed and
  // philox_offset slots; the backward hands them back in the same order
  // CUDA's flash derivative does.
  return {views.to_flagos(unpad_head_dim(out, head_dim), device), views.to_flagos(lse, device),
          views.to_flagos(cum_q, device), views.to_flagos(cum_k, device), std::move(max_q),
          std::move(max_k), views.to_flagos(rng_state, device), views.to_flagos(unused, device),
          views.to_flagos(debug_mask, device)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_attention_overrideable_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask,
    const at::Tensor& out, const at::Tensor& logsumexp, const at::Tensor& cum_seq_q,
    const at::Tensor& cum_seq_k, c10::SymInt max_q, c10::SymInt max_k, double dropout_p,
    bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    std::optional<double> scale) {
  (void)grad_input_mask;  // CUDA's flash backward computes all three gradients
  if (!grad_out.defined()) return {};
  check_flash_call("_scaled_dot_product_fused_attention_overrideable_backward", query, key,
                   value, attn_bias.defined());
  const auto device = query.device().index();
  const auto guard = runtime::guard_unless_current(device);
  NativeViews views(/*reuse_views=*/true);
  const at::Tensor q = native(views, query);
  const int64_t head_dim = q.size(-1);
  const double softmax_scale = sdp::calculate_scale(q, scale).guard_float(__FILE__, __LINE__);
  at::Tensor grad_q, grad_k, grad_v;
  {
    runtime::NativeAllocationScope scope(device);
    // On CUDA the padded inputs and the padded output are what the flash
    // forward saw and produced; the output's padding columns are zeros (the
    // padded value columns are), and the gradient reaching flash through the
    // slice is zero there too.
    std::tie(grad_q, grad_k, grad_v) = at::_scaled_dot_product_flash_attention_backward_symint(
        pad_head_dim(native(views, grad_out)), pad_head_dim(q),
        pad_head_dim(native(views, key)), pad_head_dim(native(views, value)),
        pad_head_dim(native(views, out)), native(views, logsumexp),
        native(views, cum_seq_q), native(views, cum_seq_k), std::move(max_q),
        std::move(max_k), dropout_p, is_causal, native(views, philox_seed),
        native(views, philox_offset), softmax_scale);
  }
  return {views.to_flagos(unpad_head_dim(grad_q, head_dim), device),
          views.to_flagos(unpad_head_dim(grad_k, head_dim), device),
          views.to_flagos(unpad_head_dim(grad_v, head_dim), device), at::Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_dot_product_fused_attention_overrideable",
         TORCH_FN(fused_attention_overrideable));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         TORCH_FN(fused_attention_overrideable_backward));
}

}  // namespace torch_fl::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_fl::aten::fused_sdp_choice)
}  // namespace at::native
