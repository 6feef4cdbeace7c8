// The operators that get an unboxed route (unboxed_route.h): the ones models
// call most (a Qwen3 forward and backward, HF generate, AdamW), chosen by the
// dispatch counts of the Qwen3 workload. One line each. An operator is
// registered only where the driver's native device has a kernel of its own
// for it: one that PyTorch decomposes (CompositeExplicitAutograd on that
// device) keeps decomposing above flagos, so its parts are routed one by one
// as before.

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKeySet.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_norm_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/rsub_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/topk_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/triu_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
#include <mutex>
#include <string>

#include <torch/library.h>

#include "aten/unboxed_route.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

#define FLAGOS_UNBOXED_ROUTES(X)                                                        \
  /* elementwise */                                                                     \
  X(add_Tensor) X(add__Tensor) X(add_out) X(sub_Tensor) X(sub__Tensor) X(rsub_Tensor)   \
  X(mul_Tensor) X(mul__Tensor) X(mul_out) X(div_Tensor) X(div__Tensor) X(neg)           \
  X(reciprocal) X(rsqrt) X(sqrt) X(exp) X(log) X(cos) X(sin) X(tanh) X(sigmoid) X(silu)  \
  X(gelu) X(gelu_backward) X(relu) X(threshold_backward) X(pow_Tensor_Scalar)           \
  X(pow_Tensor_Tensor) X(clamp) X(addcmul_) X(lerp__Scalar) X(where_self)                \
  X(masked_fill__Scalar) X(masked_fill__Tensor) X(fill__Scalar) X(zero_)                \
  X(eq_Tensor) X(eq_Scalar) X(ne_Tensor) X(ne_Scalar) X(lt_Tensor) X(lt_Scalar)          \
  X(gt_Tensor) X(gt_Scalar) X(ge_Scalar) X(le_Scalar)                                   \
  /* reductions and normalisation */                                                   \
  X(mean_dim) X(sum_dim_IntList) X(amax) X(argmax) X(max_dim) X(cumsum) X(topk)         \
  X(_softmax) X(_softmax_backward_data) X(_log_softmax) X(_log_softmax_backward_data)   \
  X(native_layer_norm) X(native_layer_norm_backward) X(nll_loss_forward)                \
  X(nll_loss_backward)                                                                  \
  /* indexing, shapes, matrices */                                                     \
  X(index_select) X(index_Tensor) X(gather) X(embedding_dense_backward) X(cat)          \
  X(triu) X(tril) X(arange_start_out) X(mm) X(addmm) X(bmm) X(baddbmm)                  \
  /* fused attention (scaled_dot_product_attention's choices; CUDA only) */            \
  X(_scaled_dot_product_cudnn_attention) X(_scaled_dot_product_cudnn_attention_backward) \
  X(_scaled_dot_product_efficient_attention)                                            \
  X(_scaled_dot_product_efficient_attention_backward)                                   \
  /* optimizers (CUDA has kernels for these; the CPU decomposes them) */               \
  X(_foreach_add__List) X(_foreach_add__Scalar) X(_foreach_mul__List)                   \
  X(_foreach_mul__Scalar) X(_foreach_div__List) X(_foreach_div__ScalarList)             \
  X(_foreach_lerp__Scalar) X(_foreach_addcmul__Scalar) X(_foreach_addcdiv__ScalarList)  \
  X(_foreach_sqrt) X(_foreach_sqrt_) X(_foreach_norm_Scalar)

}  // namespace

void register_unboxed_routes() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                          c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    const auto native_key = NativeCall::native_keys().highestPriorityTypeId();
    auto& dispatcher = c10::Dispatcher::singleton();
#define FLAGOS_REGISTER(op)                                                              \
  {                                                                                      \
    using Op = at::_ops::op;                                                             \
    auto handle = dispatcher.findSchema({Op::name, Op::overload_name});                  \
    if (handle && handle->hasKernelForDispatchKey(native_key) &&                          \
        !handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {               \
      lib->impl(op_key({Op::name, Op::overload_name}).c_str(),                           \
                TORCH_FN(unboxed::UnboxedRoute<Op>::call));                              \
    }                                                                                    \
  }
    FLAGOS_UNBOXED_ROUTES(FLAGOS_REGISTER)
#undef FLAGOS_REGISTER
  });
}

}  // namespace torch_fl::aten
