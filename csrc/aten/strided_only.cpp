// Flagos tensors are strided, dense and not quantized (nested and sparse COO
// ones aside: nested_tensors.cpp, sparse_tensors.cpp). A sparse compressed or
// quantized tensor made with a flagos device gets a dispatch key of its own
// (SparseCsrPrivateUse1, QuantizedPrivateUse1), for which flagos registers no
// computing kernels
// (sparse_compressed.cpp serves what brings a sparse compressed tensor's data
// back); PyTorch's
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

// The kind of tensor a fallback refuses, and how to bring one to flagos.
struct Kind {
  const char* what;
  const char* way_out;
  const char* way_back = "";  // for a kind PyTorch makes on flagos without asking it
};
constexpr Kind kSparseCompressed{"sparse compressed (CSR, CSC, BSR, BSC) tensors",
                                 "make them dense (.to_dense())",
                                 " One on flagos comes back with .cpu()."};
constexpr Kind kQuantized{"quantized tensors", "dequantize them (.dequantize())"};

template <const Kind& kKind>
void unsupported_kind(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().operator_name(), ": ", kKind.what,
                              " on flagos are not supported: flagos tensors are strided, dense "
                              "and not quantized. Keep them on the CPU, or ",
                              kKind.way_out, " before moving them to flagos.", kKind.way_back);
}

}  // namespace

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_kind<kSparseCompressed>>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_kind<kQuantized>>());
}

}  // namespace torch_fl::aten
