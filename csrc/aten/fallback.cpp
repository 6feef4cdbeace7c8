// The boxed kernel every operator without a dedicated flagos kernel reaches:
// one registration (PrivateUse1 fallback) instead of a stub per operator.
// Composite operators never get here (PyTorch decomposes them first), so
// autograd formulas stay intact.

#include <torch/library.h>

#include "aten/native_provider.h"
#include "aten/op_plan.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

// Hot path: a cached plan lookup and the provider call; nothing else.
void flagos_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                     torch::jit::Stack* stack) {
  const OpPlan& plan = plan_for(op);
  run_native(op, plan, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos_fallback>());
}

}  // namespace torch_fl::aten
