#include "aten/tune_recorder.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <c10/core/DeviceGuard.h>

#include "aten/call_copy.h"
#include "aten/call_observer.h"
#include "aten/call_signature.h"
#include "aten/fallback.h"
#include "aten/output_compare.h"
#include "aten/python_provider.h"
#include "aten/shadow_verify.h"
#include "flaggems/launcher.h"
#include "routing/table.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace torch_fl::aten {
namespace {

using routing::Backend;
using Clock = std::chrono::steady_clock;

constexpr int kBatches = 3;
// A spin kernel of this many cycles per microsecond of host time lasts at
// least that long on any GPU clocked at up to 2 GHz.
constexpr double kSpinCyclesPerUs = 2000;

struct State {
  std::mutex mu;
  bool on = false;
  TuneOptions options;
  std::deque<SignatureRecord> records;
  std::unordered_map<std::string, size_t> index;  // op + '\n' + signature -> record
};

State& state() {
  static auto* s = new State();  // leaked: written by kernels until exit
  return *s;
}

double us_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::micro>(t1 - t0).count();
}

std::string mib(size_t bytes) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(bytes) / (1 << 20) << " MiB";
  return os.str();
}

// The backend measured for `b` when both run the same kernels: cpu and native
// on the host driver, cuda and native on the cuda driver.
Backend representative(Backend b) {
  if (runtime::uses_cuda()) return b == Backend::kNative ? Backend::kCuda : b;
  return b == Backend::kCpu ? Backend::kNative : b;
}

// Event-timed batches of calls on one device (driver events, on the
// current stream).
class Timer {
 public:
  explicit Timer(c10::DeviceIndex device)
      : device_(device),
        driver_(runtime::driver()),
        start_(driver_.createEvent(device, true)),
        end_(driver_.createEvent(device, true)) {}
  ~Timer() {
    driver_.destroyEvent(start_);
    driver_.destroyEvent(end_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  struct Batch {
    double host_us, device_us;
    bool gap;  // the device waited for the host (the spin ended first)
  };

  template <class F>
  Batch batch(F&& once, int n, int64_t spin_cycles) {
    hal::StreamHandle stream = runtime::current_stream_handle(device_);
    if (spin_cycles > 0) runtime::cuda::spin(spin_cycles);
    const auto t0 = Clock::now();
    driver_.recordEvent(start_, stream);
    for (int i = 0; i < n; ++i) once();
    const auto t1 = Clock::now();
    driver_.recordEvent(end_, stream);
    const bool gap = spin_cycles > 0 && driver_.queryEvent(start_);
    driver_.synchronizeEvent(end_);
    return {us_since(t0, t1) / n, driver_.elapsedMs(start_, end_) * 1000 / n, gap};
  }

  void sync() { driver_.synchronizeDevice(device_); }

 private:
  c10::DeviceIndex device_;
  hal::Driver& driver_;
  hal::EventHandle start_;
  hal::EventHandle end_;
};

// Times `once` (warm already): fills host_us, device_us, iters, synchronizes.
template <class F>
void time_calls(F&& once, c10::DeviceIndex device, const TuneOptions& opt, BackendResult& r) {
  Timer timer(device);
  timer.sync();
  const auto t0 = Clock::now();
  once();
  timer.sync();
  const double one_us = std::max(us_since(t0, Clock::now()), 0.1);
  const int n = static_cast<int>(
      std::clamp(opt.budget_ms * 1000 / kBatches / one_us, 1.0, double(std::max(opt.max_iters, 1))));
  const bool cuda = runtime::uses_cuda();
  double spin_factor = 1.5;
  std::vector<Timer::Batch> batches;
  for (int tries = 0; batches.size() < kBatches && tries < kBatches + 3; ++tries) {
    int64_t cycles = 0;
    if (cuda && !r.synchronizes) {
      cycles = static_cast<int64_t>(n * one_us * kSpinCyclesPerUs * spin_factor) + 20000;
    }
    Timer::Batch b = timer.batch(once, n, cycles);
    if (b.gap) {
      // The host had not queued every call when the spin ended: spin longer,
      // or, after two tries, the call waits for the device itself.
      if (spin_factor < 20) {
        spin_factor *= 4;
        continue;
      }
      r.synchronizes = true;
      continue;
    }
    batches.push_back(b);
  }
  if (batches.empty()) batches.push_back(timer.batch(once, n, 0));
  std::sort(batches.begin(), batches.end(), [](const auto& a, const auto& b) {
    return std::max(a.host_us, a.device_us) < std::max(b.host_us, b.device_us);
  });
  const Timer::Batch& mid = batches[batches.size() / 2];
  r.host_us = mid.host_us;
  r.device_us = mid.device_us;
  r.iters = n;
  if (r.synchronizes) {
    r.note = "synchronizes with the host: timed without holding the stream";
  }
}

}  // namespace

void start_tuning(const TuneOptions& options) {
  TORCH_CHECK_VALUE(options.budget_ms > 0 && options.max_iters >= 1,
                    "tuning: budget_ms must be > 0 and max_iters >= 1, got budget_ms=",
                    options.budget_ms, ", max_iters=", options.max_iters);
  auto& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    TORCH_CHECK(!s.on, "tuning is already on in this process: one tuning run at a time");
    s.on = true;
    s.options = options;
    s.records.clear();
    s.index.clear();
  }
  set_observer(kObserveTune, true);
}

void stop_tuning() {
  auto& s = state();
  set_observer(kObserveTune, false);
  std::lock_guard<std::mutex> lock(s.mu);
  s.on = false;
}

bool tuning() noexcept { return observer_on(kObserveTune); }

std::vector<SignatureRecord> tune_records() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return {s.records.begin(), s.records.end()};
}

std::optional<TuneJob> tune_note_call(const c10::OperatorHandle& op, const OpPlan& plan,
                                      const c10::IValue* args) {
  std::string signature = call_signature(plan, args);
  std::string key = plan.name + '\n' + signature;
  auto& s = state();
  size_t index;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.on) return std::nullopt;
    auto it = s.index.find(key);
    if (it != s.index.end()) {
      ++s.records[it->second].calls;
      return std::nullopt;
    }
    index = s.records.size();
    s.index.emplace(std::move(key), index);
    SignatureRecord& rec = s.records.emplace_back();
    rec.op = plan.name;
    rec.signature = std::move(signature);
    rec.calls = 1;
    rec.route = routing::backend_name(plan.backend.load(std::memory_order_relaxed));
    if (plan.cpu_fallback.load(std::memory_order_relaxed)) rec.route = "cpu fallback";
    rec.reference = reference_backend_name();
    rec.skipped = rerun_skip_reason(op, plan, args);
    if (rec.skipped.empty() && plan.cpu_fallback.load(std::memory_order_relaxed)) {
      rec.skipped = "CPU fallback: no backend of this driver serves it";
    }
    if (!rec.skipped.empty()) return std::nullopt;
  }
  return TuneJob{index, copy_arguments(plan, args, CopyTarget::kFlagos)};
}

void tune_measure(const c10::OperatorHandle& op, const OpPlan& plan, TuneJob& job) {
  TuneOptions opt;
  {
    auto& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    opt = s.options;
  }
  const c10::IValue* master = job.inputs.data();
  const c10::DeviceIndex device = call_device(plan, master);
  c10::DeviceGuard guard(c10::Device(runtime::kFlagos, device));

  std::vector<c10::IValue> reference;
  std::string reference_problem;
  try {
    reference = run_reference(op, plan, master);
    drop_rng_state(op, reference);
  } catch (const std::exception& e) {
    reference_problem = "the reference kernel failed: " + error_text(e);
  }
  const std::vector<std::string> labels = output_labels(plan, written_labels(plan, master));
  const size_t input_bytes = argument_bytes(plan, master);

  std::vector<BackendResult> results;
  for (Backend b : routing::available_backends()) {
    if (!routing::serves(b, op)) continue;
    BackendResult r;
    r.backend = routing::backend_name(b);
    if (representative(b) != b) {
      r.status = "same";
      r.same_as = routing::backend_name(representative(b));
      results.push_back(std::move(r));
      continue;
    }
    int64_t kernel = -1;
    const void* desc = nullptr;
    if (b == Backend::kFlagGems) {
      if (flaggems_declines(plan, job.inputs)) {
        r.status = "declined";
        r.same_as = routing::backend_name(representative(Backend::kNative));
        r.note = "FlagGems cannot take these arguments (0-dim, empty or complex tensor, or a "
                 "generator): a flaggems route runs them on native";
        results.push_back(std::move(r));
        continue;
      }
      kernel = python_kernel_for(op).value_or(-1);
      // Timed as routing would run it: launched from C++ where described.
      desc = flaggems::describe(op);
    }
    if (b == Backend::kCpu && runtime::uses_cuda() && input_bytes > opt.cpu_copy_max_bytes) {
      r.status = "not timed";
      r.note = "the cpu route copies " + mib(input_bytes) + " of inputs each way per call";
      results.push_back(std::move(r));
      continue;
    }
    try {
      std::vector<c10::IValue> inputs = copy_arguments(plan, master, CopyTarget::kFlagos);
      std::vector<at::Tensor> inputs_written = written_tensors(plan, inputs.data());
      torch::jit::Stack stack(inputs.begin(), inputs.end());
      run_provider(op, plan, b, &stack, kernel, desc);
      if (reference_problem.empty()) {
        Comparison c = compare_outputs(call_outputs(op, plan, stack, inputs_written), reference,
                                       labels);
        r.checked = true;
        r.correct = c.ok;
        r.max_abs = c.max_abs;
        r.max_rel = c.max_rel;
        r.problem = c.problem;
      } else {
        r.problem = reference_problem;
      }
      stack.clear();
      // The first run above was the first warm-up (Triton compiles there).
      auto once = [&] {
        torch::jit::Stack s(inputs.begin(), inputs.end());
        run_provider(op, plan, b, &s, kernel, desc);
      };
      once();
      time_calls(once, device, opt, r);
      r.status = "timed";
    } catch (const std::exception& e) {
      r.status = "error";
      r.checked = true;
      r.correct = false;
      r.problem = "raised: " + error_text(e);
    }
    results.push_back(std::move(r));
  }
  // Backends measured through another: the representative's figures.
  for (BackendResult& r : results) {
    if (r.status != "same" && r.status != "declined") continue;
    for (const BackendResult& m : results) {
      if (m.backend != r.same_as) continue;
      r.host_us = m.host_us;
      r.device_us = m.device_us;
      r.iters = m.iters;
      r.synchronizes = m.synchronizes;
      r.checked = m.checked;
      r.correct = m.correct;
      r.max_abs = m.max_abs;
      r.max_rel = m.max_rel;
      r.problem = m.problem;
    }
  }
  job.inputs.clear();
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (job.record < s.records.size()) s.records[job.record].results = std::move(results);
}

}  // namespace torch_fl::aten
