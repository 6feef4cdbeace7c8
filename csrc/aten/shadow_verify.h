#pragma once

// Shadow verification (FLAGOS_VERIFY, torch_fl.verify): every routed call
// also runs on the reference kernels, the driver's own (PyTorch's CPU kernels
// on the host driver, CUDA's on the cuda driver) called directly on copies of
// the call's inputs, and the outputs (results and written arguments) are
// compared with tolerances per dtype (output_compare.h).
//
// The workload's call runs exactly as without verification, on its own
// tensors, so in-place and out= semantics and its results are unchanged; the
// reference never sees the workload's tensors. Calls of random operators (a
// second run would move the random stream) and of operators outside the aten
// namespace (a collective must not run twice) are not compared, and are
// counted as skipped. A call routed to the reference kernels themselves is compared
// too: it checks the routing path (views, in-place, out=), not the kernel.

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {

enum class VerifyMode : uint8_t {
  kOff,
  kReport,  // record divergences; torch_fl.verify reports them
  kError,   // raise at the first divergence
};

// FLAGOS_VERIFY, as routing::load() read it.
void set_env_verify_mode(VerifyMode mode);
// torch_fl.verify.enable()/disable(): wins over the environment until
// cleared (nullopt).
void set_api_verify_mode(std::optional<VerifyMode> mode);
VerifyMode verify_mode() noexcept;

struct VerifyRecord {
  std::string op;       // "aten::mm"
  std::string backend;  // the backend the calls were routed to
  uint64_t compared = 0;
  uint64_t failed = 0;
  uint64_t skipped = 0;  // random operators, reference errors
  double max_abs = 0;
  double max_rel = 0;
  std::string first_failure_call;  // call_signature() of the first failing call
  std::string first_failure;       // what differed
  std::string skip_reason;
};
std::vector<VerifyRecord> verify_records();
void reset_verify_records();

// Runs `op` on the reference kernels over native copies of `args` (the
// call's arguments, not modified) and returns its outputs: the results, then
// the written arguments (written_tensors() order). Throws what the kernel
// throws.
std::vector<c10::IValue> run_reference(const c10::OperatorHandle& op, const OpPlan& plan,
                                       const c10::IValue* args);
// "cpu" on the host driver, "cuda" on the cuda driver.
const char* reference_backend_name();

// One call under verification: made before the routed run (copies the
// inputs and runs the reference), checked after it.
class ShadowCall {
 public:
  // `args` points at the call's arguments, before the routed run.
  ShadowCall(const c10::OperatorHandle& op, const OpPlan& plan, routing::Backend backend,
             const c10::IValue* args);
  // After the routed run: `stack` holds its results. Records the outcome;
  // raises in kError mode when the outputs diverge.
  void check(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

 private:
  const OpPlan& plan_;
  routing::Backend backend_;
  std::string signature_;
  std::string skip_;
  std::vector<at::Tensor> written_;       // the workload's written tensors
  std::vector<std::string> written_labels_;
  std::vector<c10::IValue> ref_outputs_;  // reference results, then written copies
};

}  // namespace torch_fl::aten
