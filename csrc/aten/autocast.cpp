// torch.autocast("flagos"): the same op policies as CUDA's autocast (the
// lists PyTorch publishes in ATen/autocast_mode.h), applied on the
// AutocastPrivateUse1 key, and CUDA's ban on binary_cross_entropy (the lists
// leave it out: PyTorch registers it for each device's key by hand). Ops not
// listed fall through unchanged.

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::autocast {
namespace {

// What CUDA's autocast does: its fp16 result saturates where a sigmoid's
// output nears 0 or 1, so the op is refused, not cast. The text is CUDA's.
at::Tensor flagos_binary_cross_entropy_banned(const at::Tensor&, const at::Tensor&,
                                              const std::optional<at::Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
              "layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss.  "
              "binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define FLAGOS_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define FLAGOS_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define FLAGOS_FP32_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define FLAGOS_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(FLAGOS_LOWER)
  AT_FORALL_FP32(FLAGOS_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(FLAGOS_FP32_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
      KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(FLAGOS_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(flagos_binary_cross_entropy_banned));
}

}  // namespace at::autocast
