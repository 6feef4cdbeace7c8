// The op table: every aten overload the C++ path serves, the family planner
// that plans it, and which FlagGems function it launches. A new pointwise op
// is one line here; another family, one planner (ops/*.cpp).

#include "flaggems/ops/common.h"

namespace torch_fl::flaggems {
namespace {

using namespace ops;

// FlagGems' PointwiseDynamicFunctions (ops/<module>.py).
PointwiseSlot add_func{"flag_gems.ops.add", "add_func"};
PointwiseSlot sub_func{"flag_gems.ops.sub", "sub_func"};
PointwiseSlot neg_func{"flag_gems.ops.neg", "neg_func"};
PointwiseSlot rsqrt_func{"flag_gems.ops.rsqrt", "rsqrt_func"};
PointwiseSlot silu_func{"flag_gems.ops.silu", "silu_forward"};
PointwiseSlot cos_func{"flag_gems.ops.cos", "cos_func"};
PointwiseSlot sin_func{"flag_gems.ops.sin", "sin_func"};
PointwiseSlot div_func{"flag_gems.ops.div", "true_div_func"};
PointwiseSlot mul_func{"flag_gems.ops.mul", "mul_func"};
PointwiseSlot eq_func{"flag_gems.ops.eq", "eq_func"};
PointwiseSlot eq_scalar_func{"flag_gems.ops.eq", "eq_func_scalar"};
PointwiseSlot ne_func{"flag_gems.ops.ne", "ne_func"};
PointwiseSlot ne_scalar_func{"flag_gems.ops.ne", "ne_func_scalar"};
PointwiseSlot lt_func{"flag_gems.ops.lt", "lt_func"};
PointwiseSlot lt_scalar_func{"flag_gems.ops.lt", "lt_func_scalar"};
PointwiseSlot le_func{"flag_gems.ops.le", "le_func"};
PointwiseSlot le_scalar_func{"flag_gems.ops.le", "le_func_scalar"};
PointwiseSlot gt_func{"flag_gems.ops.gt", "gt_func"};
PointwiseSlot gt_scalar_func{"flag_gems.ops.gt", "gt_func_scalar"};
PointwiseSlot ge_func{"flag_gems.ops.ge", "ge_func"};
PointwiseSlot ge_scalar_func{"flag_gems.ops.ge", "ge_func_scalar"};
PointwiseSlot lerp_head{"flag_gems.ops.lerp", "lerp_scalar_kernel_head"};
PointwiseSlot lerp_tail{"flag_gems.ops.lerp", "lerp_scalar_kernel_tail"};
PointwiseSlot where_func{"flag_gems.ops.where", "where_inner"};
PointwiseSlot and_func{"flag_gems.ops.bitwise_and", "bitwise_and_func"};
PointwiseSlot or_func{"flag_gems.ops.bitwise_or", "bitwise_or_func"};
PointwiseSlot not_func{"flag_gems.ops.bitwise_not", "bitwise_not_func"};
PointwiseSlot isneginf_func{"flag_gems.ops.isneginf", "isneginf_func"};
PointwiseSlot masked_fill_func{"flag_gems.ops.masked_fill", "masked_fill_kernel"};

// Whole-tensor reductions (ops/all.py, ops/max.py).
KernelSlot all_1{"flag_gems.ops.all", "all_kernel_1", {"inp", "mid", "n_elements", "mid_size", "BLOCK_SIZE"}};
KernelSlot all_2{"flag_gems.ops.all", "all_kernel_2", {"mid", "out", "MID_SIZE", "BLOCK_MID"}};
KernelSlot max_1{"flag_gems.ops.max", "max_kernel_1", {"inp", "mid", "M", "BLOCK_SIZE"}};
KernelSlot max_2{"flag_gems.ops.max", "max_kernel_2", {"mid", "out", "mid_size", "BLOCK_MID"}};

// aten argument index per positional argument of the FlagGems function.
const PointwiseOp kAdd{&add_func, nullptr, {0, 1, 2}, 3};
const PointwiseOp kAddInplace{&add_func, nullptr, {0, 1, 2}, 3, true};
const PointwiseOp kSub{&sub_func, nullptr, {0, 1, 2}, 3};
const PointwiseOp kSubInplace{&sub_func, nullptr, {0, 1, 2}, 3, true};
const PointwiseOp kNeg{.fn = &neg_func, .args = {0}, .nargs = 1, .refuses_bool = true};
const PointwiseOp kNegInplace{
    .fn = &neg_func, .args = {0}, .nargs = 1, .inplace = true, .refuses_bool = true};
const PointwiseOp kRsqrt{&rsqrt_func, nullptr, {0}, 1};
const PointwiseOp kRsqrtInplace{&rsqrt_func, nullptr, {0}, 1, true};
const PointwiseOp kSilu{&silu_func, nullptr, {0}, 1};
const PointwiseOp kSiluInplace{&silu_func, nullptr, {0}, 1, true};
const PointwiseOp kCos{&cos_func, nullptr, {0}, 1};
const PointwiseOp kCosInplace{&cos_func, nullptr, {0}, 1, true};
const PointwiseOp kSin{&sin_func, nullptr, {0}, 1};
const PointwiseOp kSinInplace{&sin_func, nullptr, {0}, 1, true};
const PointwiseOp kDiv{&div_func, nullptr, {0, 1}, 2};
const PointwiseOp kDivInplace{&div_func, nullptr, {0, 1}, 2, true};
const PointwiseOp kMulInplace{&mul_func, nullptr, {0, 1}, 2, true};
const PointwiseOp kEq{&eq_func, nullptr, {0, 1}, 2};
const PointwiseOp kEqScalar{&eq_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kNe{&ne_func, nullptr, {0, 1}, 2};
const PointwiseOp kNeScalar{&ne_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kLt{&lt_func, nullptr, {0, 1}, 2};
const PointwiseOp kLtScalar{&lt_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kLe{&le_func, nullptr, {0, 1}, 2};
const PointwiseOp kLeScalar{&le_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kGt{&gt_func, nullptr, {0, 1}, 2};
const PointwiseOp kGtScalar{&gt_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kGe{&ge_func, nullptr, {0, 1}, 2};
const PointwiseOp kGeScalar{&ge_scalar_func, nullptr, {0, 1}, 2};
const PointwiseOp kLerp{&lerp_head, &lerp_tail, {0, 1, 2}, 3};
const PointwiseOp kLerpInplace{&lerp_head, &lerp_tail, {0, 1, 2}, 3, true};
const PointwiseOp kWhere{&where_func, nullptr, {0, 1, 2}, 3, false, true};
const PointwiseOp kAnd{&and_func, nullptr, {0, 1}, 2};
const PointwiseOp kAndInplace{&and_func, nullptr, {0, 1}, 2, true};
const PointwiseOp kOr{&or_func, nullptr, {0, 1}, 2};
const PointwiseOp kOrInplace{&or_func, nullptr, {0, 1}, 2, true};
const PointwiseOp kNot{&not_func, nullptr, {0}, 1};
const PointwiseOp kNotInplace{&not_func, nullptr, {0}, 1, true};
const PointwiseOp kIsNegInf{&isneginf_func, nullptr, {0}, 1};
const PointwiseOp kMaskedFillInplace{&masked_fill_func, nullptr, {0, 1, 2}, 3, true, false, true};

const WholeReduce kAll{&all_1, &all_2, /*passes_mid_size=*/true, /*bool_result=*/true};
const WholeReduce kMax{&max_1, &max_2, /*passes_mid_size=*/false, /*bool_result=*/false};

const Reduce kMean = Reduce::kMean;
const Reduce kArgmax = Reduce::kArgmax;
const Softmax kSoftmax = Softmax::kForward;
const Softmax kSoftmaxBackward = Softmax::kBackward;
const Softmax kLogSoftmax = Softmax::kLogForward;
const Softmax kLogSoftmaxBackward = Softmax::kLogBackward;

OpDesc g_ops[] = {
    {"add.Tensor", plan_pointwise, &kAdd},
    {"add_.Tensor", plan_pointwise, &kAddInplace},
    {"sub.Tensor", plan_pointwise, &kSub},
    {"sub_.Tensor", plan_pointwise, &kSubInplace},
    {"neg", plan_pointwise, &kNeg},
    {"neg_", plan_pointwise, &kNegInplace},
    {"rsqrt", plan_pointwise, &kRsqrt},
    {"rsqrt_", plan_pointwise, &kRsqrtInplace},
    {"silu", plan_pointwise, &kSilu},
    {"silu_", plan_pointwise, &kSiluInplace},
    {"cos", plan_pointwise, &kCos},
    {"cos_", plan_pointwise, &kCosInplace},
    {"sin", plan_pointwise, &kSin},
    {"sin_", plan_pointwise, &kSinInplace},
    {"div.Tensor", plan_pointwise, &kDiv},
    {"div_.Tensor", plan_pointwise, &kDivInplace},
    {"mul_.Tensor", plan_pointwise, &kMulInplace},
    {"eq.Tensor", plan_pointwise, &kEq},
    {"eq.Scalar", plan_pointwise, &kEqScalar},
    {"ne.Tensor", plan_pointwise, &kNe},
    {"ne.Scalar", plan_pointwise, &kNeScalar},
    {"lt.Tensor", plan_pointwise, &kLt},
    {"lt.Scalar", plan_pointwise, &kLtScalar},
    {"le.Tensor", plan_pointwise, &kLe},
    {"le.Scalar", plan_pointwise, &kLeScalar},
    {"gt.Tensor", plan_pointwise, &kGt},
    {"gt.Scalar", plan_pointwise, &kGtScalar},
    {"ge.Tensor", plan_pointwise, &kGe},
    {"ge.Scalar", plan_pointwise, &kGeScalar},
    {"lerp.Scalar", plan_pointwise, &kLerp},
    {"lerp_.Scalar", plan_pointwise, &kLerpInplace},
    {"where.self", plan_pointwise, &kWhere},
    // The .Scalar bitwise overloads and masked_fill.Scalar never reach a device
    // kernel: PyTorch turns them into the .Tensor overloads (the scalar as a
    // 0-d CPU tensor, which goes to FlagGems' wrapper) and clone + masked_fill_.
    {"bitwise_and.Tensor", plan_pointwise, &kAnd},
    {"bitwise_and_.Tensor", plan_pointwise, &kAndInplace},
    {"bitwise_or.Tensor", plan_pointwise, &kOr},
    {"bitwise_or_.Tensor", plan_pointwise, &kOrInplace},
    {"bitwise_not", plan_pointwise, &kNot},
    {"bitwise_not_", plan_pointwise, &kNotInplace},
    {"masked_fill_.Scalar", plan_pointwise, &kMaskedFillInplace},
    {"isneginf", plan_pointwise, &kIsNegInf},
    {"tril", plan_tril, nullptr},
    {"zero_", plan_fill_zero, nullptr},
    {"mean.dim", plan_reduce_dim, &kMean},
    {"argmax", plan_reduce_dim, &kArgmax},
    {"all", plan_whole_reduce, &kAll},
    {"all.dim", plan_all_dim, nullptr},
    {"max", plan_whole_reduce, &kMax},
    {"cumsum", plan_cumsum, nullptr},
    {"_softmax", plan_softmax, &kSoftmax},
    {"_softmax_backward_data", plan_softmax, &kSoftmaxBackward},
    {"_log_softmax", plan_softmax, &kLogSoftmax},
    {"_log_softmax_backward_data", plan_softmax, &kLogSoftmaxBackward},
    {"cat", plan_cat, nullptr},
    {"index_select", plan_index_select, nullptr},
    {"embedding_dense_backward", plan_embedding_backward, nullptr},
    {"nll_loss_forward", plan_nll_loss, nullptr},
    {"bmm", plan_bmm, nullptr},
    {"addmm", plan_addmm, nullptr},
};

}  // namespace

OpDesc* op_table(size_t* count) {
  *count = sizeof(g_ops) / sizeof(g_ops[0]);
  return g_ops;
}

}  // namespace torch_fl::flaggems
