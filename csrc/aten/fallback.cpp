// The boxed kernel every operator without a dedicated flagos kernel reaches:
// one registration (PrivateUse1 fallback) instead of a stub per operator.
// Composite operators never get here (PyTorch decomposes them first), so
// autograd formulas stay intact.
//
// One refinement, decided from the dispatcher rather than written per op:
// a structured operator (add.Tensor, mul_, ...) reaches a backend without a
// kernel of its own through a generated CompositeExplicitAutogradNonFunctional
// kernel that runs the meta function, allocates the output with empty() and
// dispatches the .out overload: two shape inferences and two dispatches. And
// an operator with both a CompositeExplicitAutograd kernel and a native one
// (native_layer_norm, addr, ...) would run the decomposition, which differs
// numerically from the native kernel. Where the native device has a kernel
// for the overload itself, that overload is registered to this same boxed
// kernel (register_direct_routes), so it runs once, as on the native device.
// Autograd sits above and is unaffected.

#include <algorithm>
#include <mutex>
#include <string_view>

#include <ATen/Context.h>
#include <torch/library.h>

#include "aten/call_copy.h"
#include "aten/call_observer.h"
#include "aten/fallback.h"
#include "aten/native_provider.h"
#include "aten/native_view.h"
#include "aten/op_plan.h"
#include "aten/provider_error.h"
#include "flaggems/launcher.h"
#include "routing/table.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/generator.h"

namespace torch_fl::aten {
namespace {

using routing::Backend;

[[noreturn]] void fallback_forbidden(const OpPlan& plan) {
  TORCH_CHECK(false, "flagos: ", plan.name,
              " has no backend on this driver among its route and "
              "FLAGOS_CPU_FALLBACK=error forbids running it on the CPU. "
              "Route it to a backend that serves it (torch_fl.routing.table() "
              "shows the routes) or allow the fallback.");
}

// FlagGems' kernels check fewer arguments than ATen's, and raise other
// exception types or texts (AssertionError, "Unbroadcastable") for some they
// do check. So where a FlagGems call raises, the native kernel takes the same
// arguments (still on `stack`): for invalid ones it raises ATen's error, the
// one a CUDA program sees; where it accepts them, the error is FlagGems' own
// and is raised as it came, with a warning that names the way around it. The
// native kernel runs on copies of the arguments (copy_arguments: aliasing
// kept, since ATen checks overlap before shapes), and a random operator's
// generator gets its state back, so this second run changes nothing the
// caller holds.
[[noreturn]] void check_natively(const c10::OperatorHandle& op, const OpPlan& plan,
                                 torch::jit::Stack* stack, std::exception_ptr flaggems_error) {
  const size_t base = stack->size() - plan.num_arguments;
  const c10::IValue* args = stack->data() + base;
  struct RestoreRng {
    std::optional<at::Generator> gen;
    at::Tensor state;
    ~RestoreRng() {
      if (!gen) return;
      try {
        std::lock_guard<std::mutex> lock(gen->mutex());
        gen->set_state(state);
      } catch (...) {  // runs while an error unwinds: never a second exception
      }
    }
  } rng;
  if (is_random(op, plan, args)) {
    // FlagGems' random kernels draw from the default generator (an explicit
    // one sends the call to the native kernel: flaggems_declines).
    rng.gen = runtime::default_generator(call_device(plan, args));
    std::lock_guard<std::mutex> lock(rng.gen->mutex());
    rng.state = rng.gen->get_state();
  }
  std::vector<c10::IValue> copies;
  try {
    copies = copy_arguments(plan, args, CopyTarget::kFlagos);
  } catch (...) {  // no memory for the copies: FlagGems' error stands, unchecked
    std::rethrow_exception(flaggems_error);
  }
  stack->resize(base);
  stack->insert(stack->end(), std::make_move_iterator(copies.begin()),
                std::make_move_iterator(copies.end()));
  run_native(op, plan, stack);  // ATen's own argument checks: raises for invalid ones
  const std::string key = op_key(op.operator_name());
  TORCH_WARN("flagos: FlagGems' kernel for ", key, " raised the error that follows, and the ",
             runtime::driver().name(), " driver's native kernel accepts the same arguments. To run ",
             key, " on the native kernel, route it there: ", routing::env_var(key),
             "=native, or torch_fl.routing.set_route('", key, "', 'native').");
  std::rethrow_exception(flaggems_error);
}

// Runs `flaggems` (a FlagGems launch); if it raises, check_natively. Nothing
// on the path of a call that succeeds.
template <typename F>
auto with_atens_errors(const c10::OperatorHandle& op, const OpPlan& plan,
                       torch::jit::Stack* stack, F&& flaggems) {
  const size_t depth = stack->size();
  try {
    return flaggems();
  } catch (const NotAboutArguments&) {
    throw;  // a launch, a verification, memory, an interrupt: provider_error.h
  } catch (const c10::OutOfMemoryError&) {
    throw;
  } catch (...) {
    if (stack->size() != depth) throw;  // the arguments are gone: nothing to check them with
    check_natively(op, plan, stack, std::current_exception());
  }
}

// FlagGems' kernels: launched from C++ where `desc` describes the operator
// (csrc/flaggems/launcher.h), else through FlagGems' Python wrapper
// (`python_kernel`, -1: the plan's); stub-only mode has no wrapper, so what
// C++ does not serve runs natively.
Served run_flaggems(const c10::OperatorHandle& op, const OpPlan& plan, const void* desc,
                    torch::jit::Stack* stack, int64_t python_kernel) {
  bool native = false;  // FlagGems fails on these arguments (flaggems::Ran::kNative)
  const int64_t kernel =
      python_kernel >= 0 ? python_kernel : plan.python_kernel.load(std::memory_order_relaxed);
  if (desc != nullptr && flaggems::cpp_enabled()) {
    const flaggems::Ran ran = with_atens_errors(op, plan, stack, [&] {
      return flaggems::run(op, plan, *static_cast<const flaggems::OpDesc*>(desc), python_kernel,
                           stack);
    });
    if (ran == flaggems::Ran::kCpp || ran == flaggems::Ran::kPython) {
      return {Backend::kFlagGems, ran == flaggems::Ran::kCpp};
    }
    native = ran == flaggems::Ran::kNative;
  }
  if (native || kernel < 0) {
    run_native(op, plan, stack);
    return {Backend::kNative, false};
  }
  with_atens_errors(op, plan, stack, [&] { run_python(op, plan, stack, kernel); });
  return {Backend::kFlagGems, false};
}

// The providers, inlined into the boxed kernel's hot path and shared with
// run_provider(). Returns what served the call: `backend`, except where
// flaggems runs it natively (run_flaggems).
inline Served run_on(const c10::OperatorHandle& op, const OpPlan& plan, Backend backend,
                     torch::jit::Stack* stack, int64_t python_kernel, const void* flaggems_desc) {
  switch (backend) {
    case Backend::kCpu:
      // On the host driver the CPU is the native device: zero-copy.
      if (runtime::uses_cuda()) {
        run_cpu_copy(op, plan, stack);
      } else {
        run_native(op, plan, stack);
      }
      return {backend, false};
    case Backend::kNative:
    case Backend::kCuda:
      run_native(op, plan, stack);
      return {backend, false};
    case Backend::kFlagGems:
      return run_flaggems(op, plan, flaggems_desc, stack, python_kernel);
    default:
      TORCH_CHECK(false, "flagos: backend '", routing::backend_name(backend),
                  "' chosen for ", plan.name, " has no provider in this build");
  }
}

// FlagGems (5.0.2) kernels assert a dimension or divide by a size, so they
// raise or compute garbage on 0-dim and empty tensors, most have no complex
// dtypes, and its random kernels draw from the default generator whatever
// generator the call names (docs/flaggems.md): such a call runs on the
// native kernels, and counts there. So does every call while the program asks
// for deterministic algorithms: FlagGems' kernels promise no determinism
// (some accumulate with atomics) and none raises PyTorch's alert, whereas the
// native kernels take their deterministic path or raise it.
bool declines(const OpPlan& plan, const torch::jit::Stack& stack) {
  if (at::globalContext().deterministicAlgorithms()) return true;
  const size_t base = stack.size() - plan.num_arguments;
  auto edge = [](const at::Tensor& t) {
    return t.defined() && (t.dim() == 0 || t.numel() == 0 || t.is_complex());
  };
  for (const ArgSlot& slot : plan.slots) {
    const c10::IValue& v = stack[base + slot.index];
    if (slot.kind == ArgKind::kTensor) {
      if (v.isTensor() && edge(v.toTensor())) return true;
    } else if (slot.kind == ArgKind::kTensorList) {
      if (!v.isTensorList()) continue;
      for (const at::Tensor& t : v.toTensorList()) {
        if (edge(t)) return true;
      }
    } else if (slot.kind == ArgKind::kGenerator) {
      if (v.isGenerator()) return true;
    } else if (slot.kind == ArgKind::kOptionalTensorList) {
      if (!v.isOptionalTensorList()) continue;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value() && edge(*t)) return true;
      }
    }
  }
  return false;
}

// Counts (and logs) a call served by `served`.
inline void count_call(OpPlan& plan, Served served) {
  plan.calls[static_cast<int>(served.backend)].fetch_add(1, std::memory_order_relaxed);
  if (served.flaggems_cpp) plan.flaggems_cpp_calls.fetch_add(1, std::memory_order_relaxed);
  if (routing::log_enabled()) {
    const uint8_t bit = uint8_t(1) << static_cast<int>(served.backend);
    if ((plan.logged.fetch_or(bit) & bit) == 0) routing::log_dispatch(plan, served.backend);
  }
}

}  // namespace

bool flaggems_declines(const OpPlan& plan, const torch::jit::Stack& stack) {
  return declines(plan, stack);
}

namespace {

// The operator's route, resolved again when the routing changed since.
inline Backend current_route(const c10::OperatorHandle& op, OpPlan& plan) {
  if (plan.route_epoch.load(std::memory_order_acquire) != routing::epoch()) {
    routing::resolve(op, plan);
  }
  return plan.backend.load(std::memory_order_relaxed);
}

}  // namespace

// Hot path: the route check (two relaxed loads), a counter, one load of the
// every-call word, and the provider call. No strings, locks or allocation
// unless the route must be (re)resolved or logged.
void route_planned(const c10::OperatorHandle& op, OpPlan& plan, torch::jit::Stack* stack) {
  Backend backend = current_route(op, plan);
  if (backend == Backend::kFlagGems && declines(plan, *stack)) {
    backend = Backend::kNative;
  }
  if (plan.cpu_fallback.load(std::memory_order_relaxed)) {
    if (routing::fallback_policy() == routing::FallbackPolicy::kError) {
      fallback_forbidden(plan);
    }
    plan.fallback_calls.fetch_add(1, std::memory_order_relaxed);
  }
  // Counted before the call, so that a call that raises is counted too;
  // flaggems calls after it, where C++, the wrapper or (stub-only) the native
  // kernel served it.
  if (backend != Backend::kFlagGems) count_call(plan, {backend, false});
  const void* desc = backend == Backend::kFlagGems
                         ? plan.flaggems_op.load(std::memory_order_relaxed) : nullptr;
  // One relaxed load when no observer (verification, tuning, profiling) is on.
  const Served served = C10_UNLIKELY(observing())
                            ? observe_call(op, plan, backend, stack, desc)
                            : run_on(op, plan, backend, stack, -1, desc);
  if (backend == Backend::kFlagGems) count_call(plan, served);
}

void boxed_routing_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet,
                          torch::jit::Stack* stack) {
  route_planned(op, plan_for(op), stack);
}

void layout_routing_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                           torch::jit::Stack* stack) {
  OpPlan& plan = plan_for(op);
  Backend backend = current_route(op, plan);
  // FlagGems has no kernels for nested or sparse tensors: such a call runs
  // natively and counts there, as the calls FlagGems declines do.
  if (backend == Backend::kFlagGems) backend = Backend::kNative;
  TORCH_CHECK_NOT_IMPLEMENTED(
      !(backend == Backend::kCpu && runtime::uses_cuda()), "flagos: ", plan.name,
      " is routed to 'cpu', which copies dense tensors only: a nested or sparse flagos tensor "
      "cannot take it. Route it to the native kernels (docs/routing.md: FLAGOS_OP_<op>=native), "
      "or make the tensor dense (.to_padded_tensor(padding), .to_dense()).");
  // A collective completes after its kernel returns, into the twins: the
  // flagos tensors would never see the result. (all_reduce of sparse COO
  // tensors has its own kernel: distributed/sparse_allreduce.cpp.)
  TORCH_CHECK_NOT_IMPLEMENTED(
      !op.schema().name().starts_with("c10d::"), "flagos: ", plan.name,
      ": collectives of nested or sparse flagos tensors are not supported, but for all_reduce "
      "of sparse COO tensors (the flagos backend moves dense tensors). Make them dense first "
      "(.to_dense(), .to_padded_tensor(padding)).");
  count_call(plan, {backend, false});
  run_native_layout(op, plan, keys, stack);
}

Served run_provider(const c10::OperatorHandle& op, const OpPlan& plan, Backend backend,
                    torch::jit::Stack* stack, int64_t python_kernel, const void* flaggems_desc) {
  return run_on(op, plan, backend, stack, python_kernel, flaggems_desc);
}

// Composite kernels that run on native views through the routing path, as
// the native device's own operators: those that refuse devices other than
// CPU/CUDA/XPU (mode.values), where the check then passes; and in-place ones
// that call their out= form with `self` twice (addr_), whose native kernel
// tells the in-place call from an out= one by the argument's address and
// checks `self`'s shape only for the in-place one. A boxed out= call holds the
// two in separate stack slots: a wrongly shaped `self` was resized instead;
// and those whose TensorIterator calls a DispatchStub by the tensors' device
// type, which has no PrivateUse1 entry (kaiser_window: its other overloads
// call the beta one's C++ function directly, not through the dispatcher;
// conj_physical_, a no-op on real tensors).
constexpr std::string_view kCompositesRoutedWhole[] = {
    "mode.values",        "addr_",          "kaiser_window", "kaiser_window.periodic",
    "kaiser_window.beta", "conj_physical_"};

void route_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  boxed_routing_kernel(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), stack);
}

void register_direct_routes() {
  static std::once_flag once;
  std::call_once(once, [] {
    static auto* lib = new torch::Library(torch::Library::IMPL, "aten",
                                          c10::DispatchKey::PrivateUse1,
                                          __FILE__, __LINE__);
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const auto& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      auto op = dispatcher.findOp(name);
      if (!op || !op->hasSchema()) continue;
      using K = c10::DispatchKey;
      const std::string full = op_key(name);
      bool composite = op->hasKernelForDispatchKey(K::CompositeExplicitAutogradNonFunctional) ||
                       op->hasKernelForDispatchKey(K::CompositeExplicitAutograd);
      bool native = op->hasKernelForDispatchKey(K::CPU) || op->hasKernelForDispatchKey(K::CUDA);
      bool routed_whole = std::find(std::begin(kCompositesRoutedWhole),
                                    std::end(kCompositesRoutedWhole),
                                    full) != std::end(kCompositesRoutedWhole);
      if (op->hasKernelForDispatchKey(K::PrivateUse1) ||
          !((composite && native) || routed_whole)) {
        continue;
      }
      lib->impl(full.c_str(),
                torch::CppFunction::makeFromBoxedFunction<&boxed_routing_kernel>());
    }
  });
}

// An operator with a kernel for the native device's nested or sparse
// tensors often has a composite one too (linear, softmax, coalesce's parts),
// which would take a flagos call (a fallback loses to it) and fail on the
// layout. The layout's kernel is what CPU and CUDA run, so flagos routes these
// operators directly.
void register_layout_routes() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::DispatchKey flagos :
         {c10::DispatchKey::NestedTensorPrivateUse1, c10::DispatchKey::SparsePrivateUse1,
          c10::DispatchKey::SparseCsrPrivateUse1}) {
      const c10::DispatchKey native = NativeViews::native_key_like(flagos);
      // Kept for the process's life, as register_direct_routes' library.
      auto* lib = new torch::Library(torch::Library::IMPL, "aten", flagos, __FILE__, __LINE__);
      for (const auto& name : dispatcher.getAllOpNames()) {
        if (name.name.rfind("aten::", 0) != 0) continue;
        auto op = dispatcher.findOp(name);
        if (!op || !op->hasSchema() || !op->hasKernelForDispatchKey(native) ||
            op->hasKernelForDispatchKey(flagos)) {
          continue;
        }
        lib->impl(op_key(name).c_str(),
                  torch::CppFunction::makeFromBoxedFunction<&layout_routing_kernel>());
      }
    }
  });
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&boxed_routing_kernel>());
}

}  // namespace torch_fl::aten
