#include "aten/output_compare.h"

#include <cmath>
#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <ATen/ops/abs.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/div.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/max.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/view_as_real.h>
#include <c10/util/irange.h>

#include "aten/call_signature.h"
#include "aten/native_view.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

struct Tolerances {
  std::mutex mu;
  std::unordered_map<int, Tolerance> custom;
};

Tolerances& tolerances() {
  static auto* t = new Tolerances();  // leaked: read until exit
  return *t;
}

Tolerance default_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble: return {1e-7, 1e-7};
    case at::kFloat: return {1.3e-5, 1e-5};
    case at::kHalf: return {1e-3, 1e-3};
    case at::kBFloat16: return {1.6e-2, 1e-2};
    default:
      break;
  }
  if (at::isFloatingType(dtype)) {
    // float8: twice the epsilon (e4m3 formats: 0.125; e5m2: 0.25).
    const bool e5m2 = dtype == at::ScalarType::Float8_e5m2 ||
                      dtype == at::ScalarType::Float8_e5m2fnuz;
    return e5m2 ? Tolerance{0.5, 0.5} : Tolerance{0.25, 0.25};
  }
  return {0, 0};
}

std::string shape_text(c10::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// The multi-dimensional index of flat element `i` of a tensor of `sizes`.
std::string index_text(int64_t i, c10::IntArrayRef sizes) {
  std::vector<int64_t> idx(sizes.size());
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    idx[d] = sizes[d] ? i % sizes[d] : 0;
    i = sizes[d] ? i / sizes[d] : 0;
  }
  return shape_text(idx);
}

void fail(Comparison& c, const std::string& label, const std::string& what) {
  if (c.ok) c.problem = label + ": " + what;
  c.ok = false;
}

void compare_tensors(at::Tensor a, at::Tensor b, const std::string& label, Comparison& c) {
  if (a.defined() != b.defined()) {
    fail(c, label, a.defined() ? "a tensor where the reference returned none"
                               : "none where the reference returned a tensor");
    return;
  }
  if (!a.defined()) return;
  if (a.scalar_type() != b.scalar_type()) {
    fail(c, label, std::string("dtype ") + c10::toString(a.scalar_type()) + ", reference " +
                       c10::toString(b.scalar_type()));
    return;
  }
  if (a.sizes() != b.sizes()) {
    fail(c, label, "shape " + shape_text(a.sizes()) + ", reference " + shape_text(b.sizes()));
    return;
  }
  if (a.numel() == 0) return;
  if (b.device() != a.device()) b = b.to(a.device());
  a = a.resolve_conj().resolve_neg();
  b = b.resolve_conj().resolve_neg();
  const at::ScalarType value_type = c10::toRealValueType(a.scalar_type());
  if (a.is_complex()) {
    a = at::view_as_real(a);
    b = at::view_as_real(b);
  }
  const Tolerance tol = at::isFloatingType(value_type) ? tolerance(value_type) : Tolerance{0, 0};
  at::Tensor a64 = a.to(at::kDouble).reshape(-1);
  at::Tensor b64 = b.to(at::kDouble).reshape(-1);
  // Equal values (the same infinity included) and NaN against NaN match.
  at::Tensor same = at::eq(a64, b64).logical_or_(at::logical_and(at::isnan(a64), at::isnan(b64)));
  at::Tensor diff = at::abs(at::sub(a64, b64)).masked_fill_(same, 0);
  diff.masked_fill_(at::isnan(diff), std::numeric_limits<double>::infinity());
  at::Tensor ref_abs = at::abs(b64);
  at::Tensor bad = diff.gt(ref_abs.mul(tol.rtol).add_(tol.atol)).logical_or_(at::isinf(diff));
  const double max_abs = diff.max().item<double>();
  at::Tensor rel = at::div(diff, ref_abs).masked_fill_(ref_abs.lt(std::max(tol.atol, 1e-300)), 0);
  const double max_rel = rel.max().item<double>();
  c.max_abs = std::max(c.max_abs, max_abs);
  c.max_rel = std::max(c.max_rel, max_rel);
  const int64_t nbad = bad.sum().item<int64_t>();
  if (nbad == 0) return;
  const int64_t worst = at::argmax(diff.masked_fill(bad.logical_not(), -1)).item<int64_t>();
  std::ostringstream os;
  os.precision(6);
  os << nbad << " of " << a64.numel() << " elements differ; max abs error " << max_abs
     << ", at " << index_text(worst, a.sizes()) << ": " << a64[worst].item<double>()
     << ", reference " << b64[worst].item<double>() << " (rtol " << tol.rtol << ", atol "
     << tol.atol << ")";
  fail(c, label, os.str());
}

void compare_values(const c10::IValue& got, const c10::IValue& ref, const std::string& label,
                    NativeViews& views, Comparison& c) {
  if (got.isTensor() && ref.isTensor()) {
    const at::Tensor& g = got.toTensor();
    at::Tensor native = g.defined() && g.device().type() == runtime::kFlagos ? views.to_native(g) : g;
    compare_tensors(native, ref.toTensor(), label, c);
  } else if (got.isTensorList() && ref.isTensorList()) {
    auto gl = got.toTensorList();
    auto rl = ref.toTensorList();
    if (gl.size() != rl.size()) {
      fail(c, label, std::to_string(gl.size()) + " tensors, reference " + std::to_string(rl.size()));
      return;
    }
    for (size_t i = 0; i < gl.size(); ++i) {
      compare_values(gl.get(i), rl.get(i), label + "[" + std::to_string(i) + "]", views, c);
    }
  } else if (got.isDouble() && ref.isDouble()) {
    const Tolerance tol = tolerance(at::kDouble);
    const double d = std::abs(got.toDouble() - ref.toDouble());
    const bool same = got.toDouble() == ref.toDouble() ||
                      (std::isnan(got.toDouble()) && std::isnan(ref.toDouble()));
    if (!same) {
      c.max_abs = std::max(c.max_abs, d);
      if (!(d <= tol.atol + tol.rtol * std::abs(ref.toDouble()))) {
        fail(c, label, "value " + std::to_string(got.toDouble()) + ", reference " +
                           std::to_string(ref.toDouble()));
      }
    }
  } else if (got.tagKind() != ref.tagKind()) {
    fail(c, label, "a " + got.tagKind() + " where the reference returned a " + ref.tagKind());
  } else if (!(got == ref)) {
    std::ostringstream os;
    os << "value " << got << ", reference " << ref;
    fail(c, label, os.str());
  }
}

}  // namespace

Tolerance tolerance(at::ScalarType dtype) {
  auto& t = tolerances();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    auto it = t.custom.find(static_cast<int>(dtype));
    if (it != t.custom.end()) return it->second;
  }
  return default_tolerance(dtype);
}

void set_tolerance(at::ScalarType dtype, Tolerance tol) {
  TORCH_CHECK_VALUE(at::isFloatingType(dtype) || at::isComplexType(dtype),
                    "set_tolerance: ", dtype, " is not a floating dtype: integer and bool "
                    "outputs must be equal");
  TORCH_CHECK_VALUE(tol.rtol >= 0 && tol.atol >= 0 && std::isfinite(tol.rtol) &&
                        std::isfinite(tol.atol),
                    "set_tolerance: rtol and atol must be finite and >= 0, got rtol=", tol.rtol,
                    ", atol=", tol.atol);
  auto& t = tolerances();
  std::lock_guard<std::mutex> lock(t.mu);
  t.custom[static_cast<int>(c10::toRealValueType(dtype))] = tol;
}

void reset_tolerances() {
  auto& t = tolerances();
  std::lock_guard<std::mutex> lock(t.mu);
  t.custom.clear();
}

Comparison compare_outputs(const std::vector<c10::IValue>& got,
                           const std::vector<c10::IValue>& ref,
                           const std::vector<std::string>& labels) {
  Comparison c;
  NativeViews views;
  if (got.size() != ref.size()) {
    fail(c, "outputs", std::to_string(got.size()) + " values, reference " +
                           std::to_string(ref.size()));
    return c;
  }
  for (size_t i = 0; i < got.size(); ++i) {
    compare_values(got[i], ref[i], i < labels.size() ? labels[i] : "output " + std::to_string(i),
                   views, c);
  }
  return c;
}

}  // namespace torch_fl::aten
