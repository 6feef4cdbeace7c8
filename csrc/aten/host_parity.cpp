#include "aten/host_parity.h"

#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/bincount.h>

#include "aten/host_sync_batch_norm.h"
#include "aten/native_call.h"
#include "aten/native_view.h"

namespace torch_fl::aten {
namespace {

// histc over integers as CUDA defines it (SummaryOps.cu): bounds converted to
// int64, an empty range [0, 0] taken from the data and widened by one either
// side when still empty, bin = (v - min) * bins / (max - min) in integer
// arithmetic, v == max in the last bin, values outside [min, max] ignored,
// counts in the input's dtype.
at::Tensor integral_histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                          const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "histc: bins must be > 0, got ", bins);
  int64_t lo = min.to<int64_t>();
  int64_t hi = max.to<int64_t>();
  if (lo == hi && self.numel() > 0) {
    lo = self.min().item<int64_t>();
    hi = self.max().item<int64_t>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  TORCH_CHECK(lo < hi, "histc: max must be larger than min, got min ", lo, " and max ", hi);
  const at::Tensor values = self.reshape(-1).to(at::kLong);
  const at::Tensor kept = values.masked_select(values.ge(lo).logical_and(values.le(hi)));
  const at::Tensor bin = kept.sub(lo).mul(bins).div(hi - lo, "trunc").clamp_max(bins - 1);
  return at::bincount(bin, {}, bins).to(self.scalar_type());
}

// histc(Tensor self, int bins, Scalar min, Scalar max) -> Tensor, and
// histc.out(..., *, Tensor(a!) out) -> Tensor(a!).
void histc(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const bool out_variant = op.schema().arguments().size() == 5;
  const size_t n = out_variant ? 5 : 4;
  auto args = torch::jit::last(*stack, n);
  const at::Tensor& self = args[0].toTensor();
  // CUDA's kernel takes the integer types of AT_DISPATCH_ALL_TYPES; the others
  // (bool, uint16/32/64) and floats go to the CPU kernel, which refuses what
  // it and CUDA refuse.
  switch (self.scalar_type()) {
    case at::kByte:
    case at::kChar:
    case at::kShort:
    case at::kInt:
    case at::kLong:
      break;
    default:
      op.redispatchBoxed(NativeCall::native_keys(), stack);
      return;
  }
  at::Tensor hist = integral_histc(self, args[1].toInt(), args[2].toScalar(), args[3].toScalar());
  if (out_variant) hist = into_out(args[4].toTensor(), hist);  // any dtype, as on CUDA
  torch::jit::drop(*stack, n);
  torch::jit::push(*stack, std::move(hist));
}

}  // namespace

at::Tensor into_out(at::Tensor out, const at::Tensor& result) {
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  return out;
}

HostKernel host_parity_kernel(const c10::OperatorHandle& op) {
  // Plans are built on an operator's first flagos call, after the driver is chosen.
  if (NativeViews::native_type() != c10::DeviceType::CPU) return nullptr;
  const c10::OperatorName& name = op.schema().operator_name();
  if (name.name == "aten::histc" && (name.overload_name.empty() || name.overload_name == "out")) {
    return &histc;
  }
  return sync_batch_norm_kernel(name);
}

}  // namespace torch_fl::aten
