#include "flaggems/launcher.h"

#include <array>
#include <atomic>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <c10/util/Exception.h>

#include "aten/native_provider.h"
#include "aten/op_plan.h"
#include "aten/provider_error.h"
#include "flaggems/cuda_launch.h"
#include "flaggems/disk_cache.h"
#include "flaggems/kernel_table.h"
#include "flaggems/plan.h"
#include "hal/env.h"
#include "runtime/device.h"

namespace torch_fl::flaggems {
namespace {

// ---- settings and counters -----------------------------------------------------

std::atomic<bool> g_installed{false};
std::atomic<bool> g_stub_only{false};
std::atomic<bool> g_cpp{true};
std::atomic<bool> g_strict{false};

// Launches, captures and declines are counted per op (OpDesc) only: stats()
// sums them.
enum Counter {
  kAdmitted, kPinned, kRetried, kDiskKernels, kDiskTuned, kCompiled, kTunedLearned, kNumCounters
};
constexpr const char* kCounterNames[] = {
    "admitted", "pinned", "retried", "disk_kernels", "disk_tuned", "compiled", "tuned_learned"};
std::array<std::atomic<uint64_t>, kNumCounters> g_counters{};

void count(Counter c) { g_counters[c].fetch_add(1, std::memory_order_relaxed); }

// A call the plan could not serve (the planner declined, or its arguments do
// not fit Triton's types).
Ran declined(const OpDesc& d) {
  d.declined.fetch_add(1, std::memory_order_relaxed);
  return Ran::kNotServed;
}

struct Tables {
  std::mutex mu;
  std::unordered_map<std::string, OpDesc*> by_name;  // installed descriptions
  std::vector<std::string> pinned;
};
Tables& tables() {
  static auto* t = new Tables();
  return *t;
}

// Set while this thread runs a slow path: FlagGems' own wrapper must not
// re-enter the C++ path (it works on CUDA tensors, but be safe).
thread_local bool t_in_slow_path = false;

struct SlowPathScope {
  SlowPathScope() { t_in_slow_path = true; }
  ~SlowPathScope() { t_in_slow_path = false; }
};

OpDesc* find_desc(const std::string& name) {
  size_t n = 0;
  OpDesc* ops = op_table(&n);
  for (size_t i = 0; i < n; ++i) {
    if (name == ops[i].aten) return &ops[i];
  }
  return nullptr;
}

// ---- one launch: specialization, key, packed arguments -------------------------

struct Prepared {
  Kernel* kernel = nullptr;
  abi::Key key;
  abi::Spec specs[abi::kMaxParams];
  abi::Packed packed;
};

// False when the planner produced arguments Triton would not take (a value
// out of its C type's range, an unmodelled kind): the call is declined.
bool prepare(const Launch& L, Prepared& out) {
  const JitFn& fn = *L.fn;
  if (L.n != fn.param_count()) return false;
  abi::KeyBuilder kb(&out.key, fn.id, L.num_warps, L.num_stages);
  for (int i = 0; i < L.n; ++i) {
    if (!abi::specialize(fn.params[i], L.args[i], &out.specs[i])) return false;
    if (!kb.add(out.specs[i], L.args[i])) return false;
  }
  kb.finish();
  return abi::pack(fn.params.data(), L.args, out.specs, L.n, &out.packed);
}

void launch_all(const OpDesc& d, c10::DeviceIndex device, CallPlan& p, Prepared* prep) {
  const auto guard = runtime::guard_unless_current(device);
  for (int i = 0; i < p.nlaunches; ++i) {
    Kernel* k = prep[i].kernel;
    void* f = k->function_for(device, d.aten);
    const char* err = cuda::launch(device, f, p.launches[i].grid, k->binary.num_warps,
                                   k->binary.shared, prep[i].packed.params);
    FLAGOS_PROVIDER_CHECK(err == nullptr, "flagos: launching FlagGems kernel ", k->binary.name,
                          " for ", d.aten, " failed: ", err);
  }
  if (p.post) p.post(p);
}

void finish(torch::jit::Stack* stack, size_t base, CallPlan& p) {
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  for (auto& r : p.results) stack->push_back(std::move(r));
}

// What a binary needs that the C++ launch does not do (v1: the kernels served
// here need none of it; a kernel that does stays on the Python path).
std::string unsupported(const KernelBinary& b) {
  if (b.num_ctas != 1) return "clusters (num_ctas " + std::to_string(b.num_ctas) + ")";
  if (b.global_scratch > 0 || b.profile_scratch > 0) return "scratch memory";
  if (b.cooperative) return "a cooperative launch";
  if (b.pdl) return "programmatic dependent launch";
  if (b.tensor_descriptors) return "TMA descriptors";
  if (b.cubin.empty()) return "no cubin";
  return "";
}

// Makes `k` launchable with `b`; false (with *why) when the binary cannot be
// loaded here.
bool make_ready(Kernel* k, const KernelBinary& b, const Prepared& prep, c10::DeviceIndex device,
                const char* op, std::string* why) {
  std::lock_guard<std::mutex> lock(k->admit_mu);
  // Another thread may have admitted it meanwhile (slow paths release the GIL
  // inside FlagGems' wrappers): its fields are then read by launches already.
  if (k->state.load(std::memory_order_acquire) == KernelState::kReady) return true;
  *why = unsupported(b);
  if (!why->empty()) return false;
  k->binary = b;
  k->count = prep.packed.count;
  for (int i = 0; i < prep.packed.count; ++i) k->sizes[i] = prep.packed.sizes[i];
  if (cuda::available()) {
    try {
      k->function_for(device, op);
    } catch (const c10::Error& e) {
      *why = e.what_without_backtrace();
      return false;
    }
  }
  k->state.store(KernelState::kReady, std::memory_order_release);
  return true;
}

void pin(Kernel* k, const OpDesc& d, const std::string& why) {
  if (!k) return;
  {
    std::lock_guard<std::mutex> lock(k->admit_mu);
    if (k->state.load(std::memory_order_acquire) != KernelState::kRetry) return;
    k->state.store(KernelState::kPinned, std::memory_order_release);
  }
  count(kPinned);
  std::string msg = std::string(d.aten) + ": " + why;
  {
    auto& t = tables();
    std::lock_guard<std::mutex> lock(t.mu);
    t.pinned.push_back(msg);
  }
  FLAGOS_PROVIDER_CHECK(!g_strict.load(), "flagos (FLAGOS_FLAGGEMS_VERIFY=strict): the C++ plan of ",
                        msg);
  warn_once("pin:" + std::string(d.aten), "FlagGems' " + std::string(d.aten) +
                                             " keeps running through its Python wrapper for "
                                             "some arguments: its C++ plan differs (" + why +
                                             "). torch_fl.flaggems.cpp_stats() counts these.");
}

// Exports the FlagGems function a planner asked for (Outcome::kNeedExport),
// so that it can plan again; false when that fails.
bool export_needed(const CallPlan& plan) {
  if (plan.need_slot) return resolve(*plan.need_slot);
  if (plan.need_pointwise) return resolve_rank(*plan.need_pointwise, plan.need_rank);
  return false;
}

enum class Settled : uint8_t { kOutcome, kExportFailed, kNoConvergence };

// Plans `d` on the arguments of `call` until the planner's outcome is final:
// the exports it asks for are done here (Outcome::kNeedExport), the autotuner
// configs by `tune` (Outcome::kNeedTuning; true: it supplied one, plan
// again). The last round's outcome goes to *o, its plan to `plan`, and
// `call` is that round's.
template <typename Tune>
Settled settle(const OpDesc& d, Call& call, CallPlan& plan, Outcome* o, Tune&& tune) {
  const Call fresh = call;
  for (int round = 0; round < 8; ++round) {
    call = fresh;
    plan = CallPlan();
    *o = d.planner(d, call, plan);
    if (*o == Outcome::kNeedExport) {
      if (!export_needed(plan)) return Settled::kExportFailed;
      continue;
    }
    if (*o == Outcome::kNeedTuning && tune(plan, call)) continue;
    return Settled::kOutcome;
  }
  return Settled::kNoConvergence;
}

Settled settle(const OpDesc& d, Call& call, CallPlan& plan, Outcome* o) {
  return settle(d, call, plan, o, [](CallPlan&, Call&) { return false; });
}

// Runs `body` between the Python side's capture_begin and capture_end and
// returns the capture (the capture ends when `body` throws, too).
template <typename Body>
Capture capture_of(PythonSide& side, Body&& body) {
  side.capture_begin();
  try {
    body();
  } catch (...) {
    side.capture_end();
    throw;
  }
  return side.capture_end();
}

Kernel* load_from_disk(const Launch& L, const Prepared& prep, c10::DeviceIndex device,
                       const OpDesc& d) {
  if (disk::directory().empty()) return nullptr;
  auto e = disk::load_kernel(disk::kernel_identity(*L.fn, cuda::arch(device), prep.key));
  if (!e) return nullptr;
  if (!e->verified && !g_stub_only.load()) return nullptr;  // compiled, not yet checked: capture
  Kernel* k = kernels().insert(prep.key);
  if (!k) return nullptr;
  std::string why;
  if (!make_ready(k, e->binary, prep, device, d.aten, &why)) return nullptr;
  count(kDiskKernels);
  return k;
}

// What stub-only mode (and the offline check) asks Triton to compile: the
// planned launch's specialization, warps and stages.
CompileRequest compile_request(const Launch& L, const Prepared& prep) {
  CompileRequest req;
  req.fn_id = L.fn->id;
  req.specs.assign(prep.specs, prep.specs + L.n);
  req.values.assign(L.args, L.args + L.n);
  req.num_warps = L.num_warps;
  req.num_stages = L.num_stages;
  return req;
}

Kernel* compile(const Launch& L, const Prepared& prep, c10::DeviceIndex device, const OpDesc& d) {
  PythonSide* side = python_side();
  if (!side) return nullptr;
  std::string error;
  KernelBinary b = side->compile(compile_request(L, prep), &error);
  if (!error.empty()) {
    warn_once("compile:" + std::string(d.aten),
              "compiling FlagGems' " + L.fn->ref + " for " + d.aten + " failed (" + error +
                  "); such calls run on the native kernels");
    return nullptr;
  }
  Kernel* k = kernels().insert(prep.key);
  if (!k) return nullptr;
  std::string why;
  if (!make_ready(k, b, prep, device, d.aten, &why)) {
    warn_once("compile:" + std::string(d.aten), "FlagGems' " + L.fn->ref + " for " + d.aten +
                                                    " cannot be launched from C++: " + why);
    return nullptr;
  }
  count(kCompiled);
  disk::store_kernel(disk::kernel_identity(*L.fn, cuda::arch(device), prep.key), {b, false});
  return k;
}

bool tuned_from_disk(CallPlan& plan, c10::DeviceIndex device) {
  TunerSlot* t = plan.need_tuner;
  const JitFn* fn = t->kernel->get();
  if (!fn || disk::directory().empty()) return false;
  auto cfg = disk::load_tuned(disk::tuner_identity(*fn, cuda::arch(device), plan.tuner_key,
                                                   plan.tuner_key_len));
  if (!cfg) return false;
  t->table.insert(plan.tuner_key, plan.tuner_key_len, *cfg);
  count(kDiskTuned);
  return true;
}

// FlagGems' choice for the tuner key, from the one launch of the tuned kernel
// in the capture. False when the capture has not exactly one (the autotuner
// benchmarked during it).
bool learn_tuned(CallPlan& plan, const Capture& cap, c10::DeviceIndex device) {
  TunerSlot* t = plan.need_tuner;
  const JitFn* fn = t->kernel->get();
  if (!fn) return false;
  const CapturedLaunch* found = nullptr;
  for (const auto& L : cap.launches) {
    if (L.fn_id != fn->id) continue;
    if (found) return false;
    found = &L;
  }
  if (!found || found->args.size() != fn->names.size()) return false;
  TunedConfig cfg;
  for (size_t j = 0; j < t->params.size(); ++j) {
    size_t idx = 0;
    while (idx < fn->names.size() && fn->names[idx] != t->params[j]) ++idx;
    if (idx == fn->names.size()) return false;
    const abi::Value& v = found->args[idx].value;
    if (v.kind == abi::Kind::kInt) {
      cfg.values[j] = v.i;
    } else if (v.kind == abi::Kind::kBool) {
      cfg.values[j] = v.b;
    } else {
      return false;
    }
  }
  cfg.num_warps = static_cast<uint8_t>(found->binary.num_warps);
  cfg.num_stages = static_cast<uint8_t>(found->binary.num_stages);
  t->table.insert(plan.tuner_key, plan.tuner_key_len, cfg);
  count(kTunedLearned);
  if (!disk::directory().empty()) {
    disk::store_tuned(disk::tuner_identity(*fn, cuda::arch(device), plan.tuner_key,
                                           plan.tuner_key_len),
                      cfg);
  }
  return true;
}

// ---- verification: a plan against what FlagGems' wrapper launched -------------

enum class Verdict : uint8_t { kMatch, kMismatch, kInconclusive };

void collect_pointers(const c10::IValue& v, std::vector<uint64_t>* out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined() && t.has_storage()) out->push_back(reinterpret_cast<uint64_t>(t.data_ptr()));
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.defined()) out->push_back(reinterpret_cast<uint64_t>(t.data_ptr()));
    }
  }
}

std::string value_text(const abi::Value& v) {
  std::ostringstream s;
  switch (v.kind) {
    case abi::Kind::kPtr:
      s << "*" << abi::type_name(v.elem) << "@0x" << std::hex << v.ptr;
      break;
    case abi::Kind::kInt:
      s << v.i;
      break;
    case abi::Kind::kFloat:
      s << v.f;
      break;
    case abi::Kind::kBool:
      s << (v.b ? "True" : "False");
      break;
    case abi::Kind::kNone:
      s << "None";
      break;
  }
  return s.str();
}

std::string geometry(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << "/" << t.strides() << "+" << t.storage_offset() << " " << t.scalar_type();
  return s.str();
}

Verdict compare(const CallPlan& plan, const Capture& cap, const std::vector<c10::IValue>& args,
                const std::vector<c10::IValue>& py_results, std::string* why) {
  if (cap.total != static_cast<int>(cap.launches.size())) {
    *why = "FlagGems launched " + std::to_string(cap.total - static_cast<int>(cap.launches.size())) +
           " Triton kernel(s) no C++ description exports";
    return Verdict::kMismatch;
  }
  if (static_cast<int>(cap.launches.size()) != plan.nlaunches) {
    *why = "FlagGems launched " + std::to_string(cap.launches.size()) + " kernels, the plan has " +
           std::to_string(plan.nlaunches);
    if (static_cast<int>(cap.launches.size()) < plan.nlaunches) return Verdict::kMismatch;
    // The autotuner benchmarking (several launches of the planned kernels)?
    bool all_planned = true;
    for (const auto& L : cap.launches) {
      bool known = false;
      for (int i = 0; i < plan.nlaunches; ++i) known |= L.fn_id == plan.launches[i].fn->id;
      all_planned &= known;
    }
    return all_planned ? Verdict::kInconclusive : Verdict::kMismatch;
  }
  std::vector<uint64_t> inputs;
  for (const auto& a : args) collect_pointers(a, &inputs);
  auto is_input = [&](uint64_t p) {
    for (uint64_t q : inputs) {
      if (q == p) return true;
    }
    return false;
  };
  for (int li = 0; li < plan.nlaunches; ++li) {
    const Launch& L = plan.launches[li];
    const CapturedLaunch& C = cap.launches[li];
    const JitFn& fn = *L.fn;
    const std::string where = "launch " + std::to_string(li) + " (" + fn.ref + ")";
    if (C.fn_id != fn.id) {
      const JitFn* other = jit_fn(C.fn_id);
      *why = where + ": FlagGems launched " + (other ? other->ref : C.binary.name);
      return Verdict::kMismatch;
    }
    for (int g = 0; g < 3; ++g) {
      if (C.grid[g] != L.grid[g]) {
        *why = where + ": grid[" + std::to_string(g) + "] " + std::to_string(L.grid[g]) +
               ", FlagGems " + std::to_string(C.grid[g]);
        return Verdict::kMismatch;
      }
    }
    if (C.binary.num_warps != L.num_warps || C.binary.num_stages != L.num_stages) {
      *why = where + ": num_warps/num_stages " + std::to_string(L.num_warps) + "/" +
             std::to_string(L.num_stages) + ", FlagGems " + std::to_string(C.binary.num_warps) +
             "/" + std::to_string(C.binary.num_stages);
      return Verdict::kMismatch;
    }
    if (static_cast<int>(C.args.size()) != L.n) {
      *why = where + ": " + std::to_string(C.args.size()) + " arguments captured, " +
             std::to_string(L.n) + " planned";
      return Verdict::kMismatch;
    }
    for (int i = 0; i < L.n; ++i) {
      const abi::Value& pv = L.args[i];
      const CapturedArg& ca = C.args[i];
      const std::string arg = where + " argument '" + fn.names[i] + "'";
      if (!ca.supported) {
        *why = arg + ": FlagGems passed " + ca.repr;
        return Verdict::kMismatch;
      }
      abi::Spec mine, theirs;
      if (!abi::specialize(fn.params[i], pv, &mine) ||
          !abi::parse_spec(ca.spec_type, ca.spec_attr, &theirs) || !(mine == theirs)) {
        *why = arg + ": specialization " + abi::spec_text(mine) + ", Triton's " + ca.spec_type +
               (ca.spec_attr == abi::Attr::kDiv16 ? ":D" : ca.spec_attr == abi::Attr::kEmpty ? ":''" : "");
        return Verdict::kMismatch;
      }
      // Pointers: the same element type here, the memory below; other
      // values: equal.
      const abi::Value& cv = ca.value;
      const bool ptr = pv.kind == abi::Kind::kPtr;
      if (pv.kind != cv.kind || (ptr ? pv.elem != cv.elem : !(pv == cv))) {
        *why = arg + ": planned " + value_text(pv) + ", FlagGems " + value_text(cv);
        return Verdict::kMismatch;
      }
      if (!ptr) continue;
      // Pointer roles: an argument's memory must be the same memory; a result
      // the same result; anything else a temporary on both sides.
      if (is_input(pv.ptr)) {
        if (cv.ptr != pv.ptr) {
          *why = arg + ": planned an operator argument's memory, FlagGems other memory";
          return Verdict::kMismatch;
        }
        continue;
      }
      bool result = false;
      for (size_t j = 0; j < plan.results.size() && j < py_results.size(); ++j) {
        if (!plan.results[j].isTensor() || !py_results[j].isTensor()) continue;
        if (reinterpret_cast<uint64_t>(plan.results[j].toTensor().data_ptr()) != pv.ptr) continue;
        result = true;
        if (reinterpret_cast<uint64_t>(py_results[j].toTensor().data_ptr()) != cv.ptr) {
          *why = arg + ": planned result " + std::to_string(j) + "'s memory, FlagGems other memory";
          return Verdict::kMismatch;
        }
      }
      if (!result && is_input(cv.ptr)) {
        *why = arg + ": planned a temporary, FlagGems an operator argument's memory";
        return Verdict::kMismatch;
      }
    }
  }
  if (plan.results.size() != py_results.size()) {
    *why = std::to_string(plan.results.size()) + " results planned, FlagGems returned " +
           std::to_string(py_results.size());
    return Verdict::kMismatch;
  }
  for (size_t j = 0; j < plan.results.size(); ++j) {
    const auto& a = plan.results[j];
    const auto& b = py_results[j];
    if (a.isTensor() != b.isTensor()) {
      *why = "result " + std::to_string(j) + ": a tensor on one side only";
      return Verdict::kMismatch;
    }
    if (!a.isTensor()) continue;
    const at::Tensor& x = a.toTensor();
    const at::Tensor& y = b.toTensor();
    if (x.sizes() != y.sizes() || x.strides() != y.strides() ||
        x.storage_offset() != y.storage_offset() || x.scalar_type() != y.scalar_type()) {
      *why = "result " + std::to_string(j) + ": planned " + geometry(x) + ", FlagGems " +
             geometry(y);
      return Verdict::kMismatch;
    }
  }
  return Verdict::kMatch;
}

// Plans `d` on `args` again after a capture (exporting, and learning the
// autotuner's choice from the capture, as needed), compares, and when
// `admit`, admits the kernels or pins / retries their keys. Returns "" on a
// match, else the reason.
std::string learn_and_verify(const OpDesc& d, std::vector<c10::IValue>& args, const Capture& cap,
                             const std::vector<c10::IValue>& py_results, bool admit) {
  if (!cap.error.empty()) {
    if (admit) {
      warn_once("capture:" + std::string(d.aten),
                "checking the C++ plan of FlagGems' " + std::string(d.aten) +
                    " failed (" + cap.error + "); such calls keep running its Python wrapper");
    }
    return "the capture failed: " + cap.error;
  }
  Call call(args.data(), static_cast<int>(args.size()));
  CallPlan plan;
  Outcome o;
  const Settled s = settle(d, call, plan, &o, [&](CallPlan& p, Call& c) {
    return learn_tuned(p, cap, c.device());
  });
  if (s == Settled::kExportFailed) return "a FlagGems function could not be exported";
  if (s == Settled::kNoConvergence) return "planning did not converge";
  if (o == Outcome::kDecline) return "the planner declines these arguments";
  if (o == Outcome::kNative) return "FlagGems fails on these arguments: native serves them";
  if (o == Outcome::kNeedTuning) {
    count(kRetried);
    return "the capture holds no single launch of the autotuned kernel (autotuning?)";
  }
  Prepared prep[kMaxLaunches];
  for (int i = 0; i < plan.nlaunches; ++i) {
    if (!prepare(plan.launches[i], prep[i])) return "the plan's arguments do not fit Triton's types";
  }
  std::string why;
  const Verdict v = compare(plan, cap, args, py_results, &why);
  if (!admit) return v == Verdict::kMatch ? "" : why;
  for (int i = 0; i < plan.nlaunches; ++i) {
    Kernel* k = kernels().insert(prep[i].key);
    if (!k || k->state.load() == KernelState::kReady) continue;
    if (v == Verdict::kMismatch) {
      pin(k, d, why);
      continue;
    }
    if (v == Verdict::kInconclusive) {
      count(kRetried);
      if (k->attempts.fetch_add(1) + 1 >= 3) pin(k, d, why + " (3 captures)");
      continue;
    }
    std::string bad;
    if (!make_ready(k, cap.launches[i].binary, prep[i], call.device(), d.aten, &bad)) {
      pin(k, d, "FlagGems' kernel cannot be launched from C++: " + bad);
      continue;
    }
    count(kAdmitted);
    if (!disk::directory().empty()) {
      disk::store_kernel(
          disk::kernel_identity(*plan.launches[i].fn, cuda::arch(call.device()), prep[i].key),
          {cap.launches[i].binary, true});
    }
  }
  return v == Verdict::kMatch ? "" : why;
}

Ran capture(const c10::OperatorHandle& op, const aten::OpPlan& oplan, const OpDesc& d,
            int64_t python_kernel, torch::jit::Stack* stack, std::vector<c10::IValue>& args) {
  PythonSide* side = python_side();
  d.captured.fetch_add(1, std::memory_order_relaxed);
  bool returned = false;  // the wrapper ran: the stack holds its results
  try {
    Capture cap = capture_of(*side, [&] {
      aten::run_python(op, oplan, stack, python_kernel);
      returned = true;
    });
    const size_t nret = oplan.num_returns;
    std::vector<c10::IValue> results(stack->end() - static_cast<std::ptrdiff_t>(nret),
                                     stack->end());
    learn_and_verify(d, args, cap, results, /*admit=*/true);
  } catch (...) {
    if (!returned) throw;
    aten::rethrow_not_about_arguments(std::current_exception());
  }
  return Ran::kPython;
}

Ran slow_locked(const c10::OperatorHandle& op, const aten::OpPlan& oplan, const OpDesc& d,
                int64_t python_kernel, torch::jit::Stack* stack) {
  const size_t n = oplan.num_arguments;
  const size_t base = stack->size() - n;
  std::vector<c10::IValue> args(stack->begin() + static_cast<std::ptrdiff_t>(base), stack->end());
  Call call(args.data(), static_cast<int>(n));
  CallPlan plan;
  Outcome o;
  const Settled settled = settle(d, call, plan, &o, [](CallPlan& p, Call& c) {
    return tuned_from_disk(p, c.device());
  });
  if (settled != Settled::kOutcome || o == Outcome::kDecline) return declined(d);
  if (o == Outcome::kNative) return Ran::kNative;
  if (o == Outcome::kNeedTuning) {
    if (g_stub_only.load()) return declined(d);  // no wrapper to learn FlagGems' choice from
    return capture(op, oplan, d, python_kernel, stack, args);
  }
  Prepared prep[kMaxLaunches];
  for (int i = 0; i < plan.nlaunches; ++i) {
    if (!prepare(plan.launches[i], prep[i])) return declined(d);
    Kernel* k = kernels().find(prep[i].key);
    const KernelState s = k ? k->state.load(std::memory_order_acquire) : KernelState::kRetry;
    if (k && s == KernelState::kPinned) return Ran::kNotServed;
    if (k && s == KernelState::kReady) {
      prep[i].kernel = k;
      continue;
    }
    if (Kernel* from_disk = load_from_disk(plan.launches[i], prep[i], call.device(), d)) {
      prep[i].kernel = from_disk;
      continue;
    }
    if (!g_stub_only.load()) return capture(op, oplan, d, python_kernel, stack, args);
    Kernel* compiled = compile(plan.launches[i], prep[i], call.device(), d);
    if (!compiled) return Ran::kNotServed;
    prep[i].kernel = compiled;
  }
  launch_all(d, call.device(), plan, prep);
  finish(stack, base, plan);
  d.launched.fetch_add(1, std::memory_order_relaxed);
  return Ran::kCpp;
}

}  // namespace

// ---- public API -------------------------------------------------------------------

void install(const std::vector<std::string>& ops, const std::string& triton_version,
             bool stub_only) {
  bool cpp = true;
  if (auto v = hal::env_value("FLAGOS_FLAGGEMS_CPP")) {
    TORCH_CHECK_VALUE(*v == "0" || *v == "1", "FLAGOS_FLAGGEMS_CPP='", *v,
                      "' is not valid: use 1 (the default: FlagGems kernels launched from C++) "
                      "or 0 (through FlagGems' Python wrappers only)");
    cpp = *v == "1";
  }
  if (auto v = hal::env_value("FLAGOS_FLAGGEMS_VERIFY")) {
    TORCH_CHECK_VALUE(*v == "first" || *v == "strict", "FLAGOS_FLAGGEMS_VERIFY='", *v,
                      "' is not valid: use first (the default: a plan that differs from "
                      "FlagGems' launch keeps that call on Python) or strict (raise)");
    g_strict.store(*v == "strict");
  }
  TORCH_CHECK_VALUE(!stub_only || cpp, "FLAGOS_DISABLE_FLAGGEMS_PY=1 (C++ stub-only mode) needs "
                    "the C++ launch path: unset FLAGOS_FLAGGEMS_CPP or set it to 1");
  const bool version_ok = triton_version.rfind(std::string(abi::kTritonVersion) + ".", 0) == 0 ||
                          triton_version == abi::kTritonVersion;
  if (!version_ok) {
    std::string msg = "the C++ launch path of FlagGems kernels implements Triton " +
                      std::string(abi::kTritonVersion) + "'s calling convention, but Triton " +
                      triton_version + " is installed";
    TORCH_CHECK(!stub_only, "flagos: ", msg, "; FLAGOS_DISABLE_FLAGGEMS_PY=1 (C++ stub-only "
                "mode) cannot serve FlagGems' operators. Install triton==",
                abi::kTritonVersion, ".* or unset FLAGOS_DISABLE_FLAGGEMS_PY.");
    TORCH_WARN("flagos: ", msg, ": FlagGems' operators run through its Python wrappers.");
    return;
  }
  set_triton_version(triton_version);
  auto& t = tables();
  {
    std::lock_guard<std::mutex> lock(t.mu);
    t.by_name.clear();
    for (const auto& name : ops) {
      if (OpDesc* d = find_desc(name)) t.by_name[name] = d;
    }
  }
  g_cpp.store(cpp);
  g_stub_only.store(stub_only);
  g_installed.store(true);
}

bool installed() noexcept { return g_installed.load(); }
bool cpp_enabled() noexcept { return g_cpp.load(std::memory_order_relaxed); }
void set_cpp_enabled(bool on) noexcept { g_cpp.store(on); }

const OpDesc* describe(const c10::OperatorHandle& op) {
  if (!installed()) return nullptr;
  auto& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.by_name.find(aten::op_key(op.operator_name()));
  return it == t.by_name.end() ? nullptr : it->second;
}

std::vector<std::string> described_ops() {
  auto& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::string> out;
  for (const auto& [name, d] : t.by_name) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

// Hot path: plan, specialize, find every kernel, launch. Anything else (a
// decline, a kernel not known yet, a pinned key) leaves it.
Ran run(const c10::OperatorHandle& op, const aten::OpPlan& oplan, const OpDesc& d,
        int64_t python_kernel, torch::jit::Stack* stack) {
  if (t_in_slow_path) return Ran::kNotServed;
  const size_t base = stack->size() - oplan.num_arguments;
  Call call(stack->data() + base, oplan.num_arguments);
  CallPlan p;
  const Outcome o = d.planner(d, call, p);
  if (o == Outcome::kNative) return Ran::kNative;
  if (o == Outcome::kDecline) return declined(d);
  if (o == Outcome::kPlanned) {
    Prepared prep[kMaxLaunches];
    bool hit = true;
    for (int i = 0; i < p.nlaunches; ++i) {
      if (!prepare(p.launches[i], prep[i])) return declined(d);
      Kernel* k = kernels().find(prep[i].key);
      const KernelState s = k ? k->state.load(std::memory_order_acquire) : KernelState::kRetry;
      if (s == KernelState::kPinned) return Ran::kNotServed;
      if (s != KernelState::kReady) {
        hit = false;
        break;
      }
      prep[i].kernel = k;
    }
    if (hit) {
      launch_all(d, call.device(), p, prep);
      finish(stack, base, p);
      d.launched.fetch_add(1, std::memory_order_relaxed);
      return Ran::kCpp;
    }
  }
  PythonSide* side = python_side();
  if (!side) return Ran::kNotServed;
  Ran ran = Ran::kNotServed;
  side->with_gil([&] {
    SlowPathScope scope;
    ran = slow_locked(op, oplan, d, python_kernel, stack);
  });
  return ran;
}

std::vector<std::pair<std::string, uint64_t>> stats() {
  uint64_t launches = 0, captures = 0, declines = 0;
  size_t n = 0;
  const OpDesc* ops = op_table(&n);
  for (size_t i = 0; i < n; ++i) {
    launches += ops[i].launched.load();
    captures += ops[i].captured.load();
    declines += ops[i].declined.load();
  }
  std::vector<std::pair<std::string, uint64_t>> out;
  out.emplace_back("launched", launches);
  out.emplace_back("captures", captures);
  for (int i = 0; i < kNumCounters; ++i) out.emplace_back(kCounterNames[i], g_counters[i].load());
  out.emplace_back("declined", declines);
  out.emplace_back("kernels", kernels().size());
  return out;
}

std::vector<std::pair<std::string, std::vector<uint64_t>>> op_stats() {
  std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
  size_t n = 0;
  OpDesc* ops = op_table(&n);
  for (size_t i = 0; i < n; ++i) {
    const OpDesc& d = ops[i];
    uint64_t a = d.launched.load(), b = d.captured.load(), c = d.declined.load();
    if (a || b || c) out.push_back({d.aten, {a, b, c}});
  }
  return out;
}

std::vector<std::string> pinned() {
  auto& t = tables();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.pinned;
}

// ---- offline checks -----------------------------------------------------------------

namespace {

std::vector<std::string> result_texts(const CallPlan& plan) {
  std::vector<std::string> out;
  for (const auto& r : plan.results) out.push_back(r.isTensor() ? geometry(r.toTensor()) : "?");
  return out;
}

}  // namespace

PlanReport plan_only(const std::string& aten_op, std::vector<c10::IValue> args) {
  OpDesc* d = find_desc(aten_op);
  TORCH_CHECK_VALUE(d != nullptr, "no C++ description for '", aten_op, "'");
  PlanReport report;
  Call call(args.data(), static_cast<int>(args.size()));
  CallPlan plan;
  Outcome o;
  const Settled settled = settle(*d, call, plan, &o);
  if (settled != Settled::kOutcome) {
    report.outcome = settled == Settled::kExportFailed ? "export-failed" : "no-convergence";
    return report;
  }
  if (o == Outcome::kDecline) {
    report.outcome = "decline";
  } else if (o == Outcome::kNative) {
    report.outcome = "native";
  } else if (o == Outcome::kNeedTuning) {
    report.outcome = "need-tuning";
  } else {
    report.outcome = "planned";
    for (int i = 0; i < plan.nlaunches; ++i) {
      const Launch& L = plan.launches[i];
      PlannedLaunch pl;
      pl.fn_id = L.fn->id;
      pl.fn_ref = L.fn->ref;
      std::copy(L.grid, L.grid + 3, pl.grid);
      pl.num_warps = L.num_warps;
      pl.num_stages = L.num_stages;
      for (int j = 0; j < L.n; ++j) {
        abi::Spec s;
        bool ok = j < L.fn->param_count() && abi::specialize(L.fn->params[j], L.args[j], &s);
        pl.names.push_back(j < L.fn->param_count() ? L.fn->names[j] : "?");
        pl.specs.push_back(ok ? abi::spec_text(s) : "unspecializable");
        pl.values.push_back(value_text(L.args[j]));
      }
      report.launches.push_back(std::move(pl));
    }
    report.results = result_texts(plan);
  }
  return report;
}

std::string check_against_capture(const std::string& aten_op, std::vector<c10::IValue> args,
                                  const std::function<std::vector<c10::IValue>()>& run_wrapper) {
  OpDesc* d = find_desc(aten_op);
  TORCH_CHECK_VALUE(d != nullptr, "no C++ description for '", aten_op, "'");
  PythonSide* side = python_side();
  TORCH_CHECK(side != nullptr, "flagos: the FlagGems Python side is not installed");
  std::vector<c10::IValue> results;
  Capture cap = capture_of(*side, [&] { results = run_wrapper(); });
  return learn_and_verify(*d, args, cap, results, /*admit=*/false);
}

}  // namespace torch_fl::flaggems

namespace torch_fl::flaggems {

std::vector<std::string> compile_plan(const std::string& aten_op, std::vector<c10::IValue> args) {
  OpDesc* d = find_desc(aten_op);
  TORCH_CHECK_VALUE(d != nullptr, "no C++ description for '", aten_op, "'");
  PythonSide* side = python_side();
  TORCH_CHECK(side != nullptr, "flagos: the FlagGems Python side is not installed");
  Call call(args.data(), static_cast<int>(args.size()));
  CallPlan plan;
  Outcome o;
  const Settled s = settle(*d, call, plan, &o);
  TORCH_CHECK(s != Settled::kExportFailed, "flagos: exporting a FlagGems function for ", aten_op,
              " failed");
  TORCH_CHECK(s != Settled::kNoConvergence, "flagos: planning ", aten_op, " did not converge");
  TORCH_CHECK(o == Outcome::kPlanned, "flagos: ", aten_op, " is not planned for these arguments");
  std::vector<std::string> hashes;
  for (int i = 0; i < plan.nlaunches; ++i) {
    const Launch& L = plan.launches[i];
    Prepared prep;
    TORCH_CHECK(prepare(L, prep), "flagos: the plan's arguments do not fit Triton's types");
    std::string error;
    KernelBinary b = side->compile(compile_request(L, prep), &error);
    TORCH_CHECK(error.empty(), "flagos: compiling ", L.fn->ref, " failed: ", error);
    if (!b.entry_sizes.empty()) {
      bool same = static_cast<int>(b.entry_sizes.size()) == prep.packed.count;
      for (int j = 0; same && j < prep.packed.count; ++j) {
        same = b.entry_sizes[j] == prep.packed.sizes[j];
      }
      TORCH_CHECK(same, "flagos: ", L.fn->ref, "'s PTX entry takes ", b.entry_sizes.size(),
                  " parameters, the Triton packing fills ", prep.packed.count,
                  " (or their sizes differ)");
    }
    hashes.push_back(b.hash);
  }
  return hashes;
}

}  // namespace torch_fl::flaggems
