#include "aten/shadow_verify.h"

#include <map>
#include <mutex>

#include <c10/core/DeviceGuard.h>

#include "aten/call_copy.h"
#include "aten/call_observer.h"
#include "aten/call_signature.h"
#include "aten/native_call.h"
#include "aten/native_view.h"
#include "aten/output_compare.h"
#include "runtime/device.h"

namespace torch_fl::aten {
namespace {

std::atomic<VerifyMode> g_env_mode{VerifyMode::kOff};
std::atomic<int> g_api_mode{-1};  // -1: none; else a VerifyMode

void apply_mode() {
  set_observer(kObserveVerify, verify_mode() != VerifyMode::kOff);
}

struct Records {
  std::mutex mu;
  // (operator, backend) -> record; ordered so that reports are stable.
  std::map<std::pair<std::string, int>, VerifyRecord> by_op;
};

Records& records() {
  static auto* r = new Records();  // leaked: written by kernels until exit
  return *r;
}

VerifyRecord& record_of(Records& r, const OpPlan& plan, routing::Backend backend) {
  auto& rec = r.by_op[{plan.name, static_cast<int>(backend)}];
  if (rec.op.empty()) {
    rec.op = plan.name;
    rec.backend = routing::backend_name(backend);
  }
  return rec;
}

}  // namespace

void set_env_verify_mode(VerifyMode mode) {
  g_env_mode.store(mode);
  apply_mode();
}

void set_api_verify_mode(std::optional<VerifyMode> mode) {
  g_api_mode.store(mode ? static_cast<int>(*mode) : -1);
  apply_mode();
}

VerifyMode verify_mode() noexcept {
  const int api = g_api_mode.load(std::memory_order_relaxed);
  return api >= 0 ? static_cast<VerifyMode>(api) : g_env_mode.load(std::memory_order_relaxed);
}

std::vector<VerifyRecord> verify_records() {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<VerifyRecord> out;
  for (const auto& [key, rec] : r.by_op) out.push_back(rec);
  return out;
}

void reset_verify_records() {
  auto& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_op.clear();
}

const char* reference_backend_name() {
  return NativeViews::native_type() == c10::DeviceType::CPU ? "cpu" : "cuda";
}

std::vector<c10::IValue> run_reference(const c10::OperatorHandle& op, const OpPlan& plan,
                                       const c10::IValue* args) {
  std::vector<c10::IValue> ref_args = copy_arguments(plan, args, CopyTarget::kNative);
  std::vector<at::Tensor> ref_written = written_tensors(plan, ref_args.data());
  torch::jit::Stack stack(std::make_move_iterator(ref_args.begin()),
                          std::make_move_iterator(ref_args.end()));
  c10::DeviceGuard guard(c10::Device(runtime::kFlagos, call_device(plan, args)));
  op.redispatchBoxed(NativeCall::native_keys(), &stack);
  std::vector<c10::IValue> out(std::make_move_iterator(stack.end() - plan.num_returns),
                               std::make_move_iterator(stack.end()));
  for (at::Tensor& t : ref_written) out.emplace_back(std::move(t));
  return out;
}

ShadowCall::ShadowCall(const c10::OperatorHandle& op, const OpPlan& plan,
                       routing::Backend backend, const c10::IValue* args)
    : plan_(plan), backend_(backend) {
  skip_ = rerun_skip_reason(op, plan, args);
  if (!skip_.empty()) return;
  signature_ = call_signature(plan, args);
  written_ = written_tensors(plan, args);
  written_labels_ = written_labels(plan, args);
  try {
    ref_outputs_ = run_reference(op, plan, args);
    drop_rng_state(op, ref_outputs_);
  } catch (const std::exception& e) {
    skip_ = std::string("the reference kernel failed: ") + error_text(e);
  }
}

void ShadowCall::check(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  auto& r = records();
  if (!skip_.empty()) {
    std::lock_guard<std::mutex> lock(r.mu);
    VerifyRecord& rec = record_of(r, plan_, backend_);
    ++rec.skipped;
    if (rec.skip_reason.empty()) rec.skip_reason = skip_;
    return;
  }
  Comparison c;
  try {
    c = compare_outputs(call_outputs(op, plan_, stack, written_), ref_outputs_,
                        output_labels(plan_, written_labels_));
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(r.mu);
    VerifyRecord& rec = record_of(r, plan_, backend_);
    ++rec.skipped;
    if (rec.skip_reason.empty()) rec.skip_reason = "comparison failed: " + error_text(e);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(r.mu);
    VerifyRecord& rec = record_of(r, plan_, backend_);
    ++rec.compared;
    rec.max_abs = std::max(rec.max_abs, c.max_abs);
    rec.max_rel = std::max(rec.max_rel, c.max_rel);
    if (!c.ok) {
      if (rec.failed++ == 0) {
        rec.first_failure_call = signature_;
        rec.first_failure = c.problem;
      }
    }
  }
  if (!c.ok && verify_mode() == VerifyMode::kError) {
    TORCH_CHECK(false, "flagos verify: ", plan_.name, " on backend '",
                routing::backend_name(backend_), "' diverges from the reference (",
                reference_backend_name(), " kernels): ", c.problem, "; call: ", signature_,
                ". FLAGOS_VERIFY=1 records divergences instead of raising.");
  }
}

}  // namespace torch_fl::aten
