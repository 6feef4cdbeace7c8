// Flagos tensors are strided. A sparse COO or nested tensor made with a flagos
// device gets a layout dispatch key of its own (SparsePrivateUse1,
// NestedTensorPrivateUse1), for which flagos registers no kernels; PyTorch's
// own message for that ("Could not run ... 'Sparseflagos' backend ... omitted
// during the selective/custom build") points the user at their build. These
// fallbacks take exactly the calls that would fail that way (a kernel
// registered for the key, or a composite one, still wins) and say what is
// wrong and what to do instead.

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

namespace torch_fl::aten {
namespace {

// The layout a fallback refuses, and how to bring such a tensor to flagos.
struct Layout {
  const char* what;
  const char* way_out;
};
constexpr Layout kSparseCoo{"sparse COO (torch.sparse_coo) tensors",
                            "make them dense (.to_dense())"};
constexpr Layout kNested{"nested tensors (torch.nested)",
                         "pad them into one tensor (.to_padded_tensor(padding))"};

template <const Layout& kLayout>
void not_strided(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(), ": ", kLayout.what,
                              " on flagos are not supported: flagos tensors are strided "
                              "(torch.strided) only. Keep them on the CPU, or ",
                              kLayout.way_out, " before moving them to flagos.");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&not_strided<kSparseCoo>>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&not_strided<kNested>>());
}

}  // namespace torch_fl::aten
