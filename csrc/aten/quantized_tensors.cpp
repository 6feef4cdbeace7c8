// Quantized tensors are not flagos tensors. One made with a flagos device gets
// a dispatch key of its own (QuantizedPrivateUse1), for which flagos registers
// no kernels; PyTorch's own message for that ("Could not run ... 'Quantizedflagos'
// backend ... omitted during the selective/custom build") points the user at
// their build. This fallback takes exactly the calls that would fail that way
// (a kernel registered for the key, or a composite one, still wins) and says
// what is wrong and what to do instead.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace torch_fl::aten {
namespace {

void refuse_quantized(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(),
                              ": quantized tensors on flagos are not supported: flagos tensors "
                              "are not quantized. Keep them on the CPU, or dequantize them "
                              "(.dequantize()) before moving them to flagos.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_quantized>());
}

}  // namespace torch_fl::aten
