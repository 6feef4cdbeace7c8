#pragma once

// Unboxed routes: for the operators models call most, a kernel registered
// with the operator's own C++ signature. When the operator's route runs the
// driver's own kernels (native, cuda, or cpu on the host driver), it calls
// that kernel directly with native views: no IValue stack, no boxed wrappers
// on either side, no schema walk. Otherwise (a flaggems or cpu-copy route, a
// CPU fallback, the dispatch log or a call observer active) it hands the call
// to the boxed routing kernel, which stays the one place that decides routes.
// Routing semantics are therefore identical: the route is the operator's
// plan, calls are counted on the same counters, and errors are NativeCall's.
//
// UnboxedRoute<at::_ops::add_Tensor>::call is the kernel for add.Tensor; the
// argument and result conversions below are chosen by C++ type, so one line
// per operator registers it (unboxed_routes.cpp).

#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/MaybeOwned.h>

#include "aten/fallback.h"
#include "aten/native_call.h"
#include "aten/op_plan.h"
#include "routing/table.h"

namespace torch_fl::aten::unboxed {

// ---- arguments ----------------------------------------------------------------
// Arg<T> holds the native form of one argument of C++ type T. Construction
// (phase 1) converts tensors and devices and finds the call's device; get()
// (phase 2, after NativeCall::finish_arguments) hands the value to the native
// kernel, resolving what needs the device (generators).

template <class T, class = void>
struct Arg {  // anything else passes through as it is
  T value;
  Arg(NativeCall&, T v) : value(std::forward<T>(v)) {}
  T get(NativeCall&) { return std::forward<T>(value); }
};

// Read-only tensors are borrowed: NativeCall keeps each view alive until the
// call ends (and the caller its own tensors), so the kernel's argument takes
// no reference count of its own.
template <>
struct Arg<const at::Tensor&> {
  c10::MaybeOwned<at::Tensor> native;
  Arg(NativeCall& call, const at::Tensor& t)
      : native(c10::MaybeOwned<at::Tensor>::borrowed(call.arg(t))) {}
  const at::Tensor& get(NativeCall&) { return *native; }
};

template <>
struct Arg<at::Tensor&> {  // in-place and out= arguments
  at::Tensor* flagos;
  at::Tensor native;
  Arg(NativeCall& call, at::Tensor& t) : flagos(&t), native(call.written_arg(t)) {}
  at::Tensor& get(NativeCall&) { return native; }
};

// Tensors borrowed the same way where the kernel wants them as Tensor
// objects of their own (an optional, a list): each is a borrow
// (c10::MaybeOwnedTraits), given back without a reference count when the
// argument ends, also when a later conversion throws.
class BorrowedTensors {
 public:
  BorrowedTensors() = default;
  // Moved into the call's argument tuple: the moved-from list is left empty.
  BorrowedTensors(BorrowedTensors&&) = default;
  BorrowedTensors(const BorrowedTensors&) = delete;
  BorrowedTensors& operator=(const BorrowedTensors&) = delete;
  ~BorrowedTensors() {
    for (at::Tensor& t : tensors_) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
  }
  void reserve(size_t n) { tensors_.reserve(n); }
  void push_back(const at::Tensor& t) {
    tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(t));
  }
  at::TensorList list() const { return tensors_; }

 private:
  c10::SmallVector<at::Tensor, 8> tensors_;
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> native;
  Arg(NativeCall& call, const std::optional<at::Tensor>& t) {
    if (t.has_value()) native = c10::MaybeOwnedTraits<at::Tensor>::createBorrow(call.arg(*t));
  }
  // Moved into the call's argument tuple: the moved-from tensor is undefined,
  // which destroyBorrow gives back as it is.
  Arg(Arg&&) = default;
  Arg(const Arg&) = delete;
  Arg& operator=(const Arg&) = delete;
  ~Arg() {
    if (native.has_value()) c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(*native);
  }
  const std::optional<at::Tensor>& get(NativeCall&) { return native; }
};

template <>
struct Arg<const at::ITensorListRef&> {
  BorrowedTensors native;
  Arg(NativeCall& call, const at::ITensorListRef& list) {
    native.reserve(list.size());
    call.reserve(list.size());
    for (const at::Tensor& t : list) native.push_back(call.arg(t));
  }
  at::ITensorListRef get(NativeCall&) { return at::ITensorListRef(native.list()); }
};

template <>
struct Arg<at::TensorList> {
  BorrowedTensors native;
  Arg(NativeCall& call, at::TensorList list) {
    native.reserve(list.size());
    call.reserve(list.size());
    for (const at::Tensor& t : list) native.push_back(call.arg(t));
  }
  at::TensorList get(NativeCall&) { return native.list(); }
};

template <>
struct Arg<const c10::List<std::optional<at::Tensor>>&> {  // indices: CPU ones allowed
  c10::List<std::optional<at::Tensor>> native;
  Arg(NativeCall& call, const c10::List<std::optional<at::Tensor>>& list) {
    native.reserve(list.size());
    call.reserve(list.size());
    for (const std::optional<at::Tensor>& t : list) {
      native.push_back(t.has_value() ? std::optional<at::Tensor>(call.arg(*t, true))
                                     : std::nullopt);
    }
  }
  const c10::List<std::optional<at::Tensor>>& get(NativeCall&) { return native; }
};

template <>
struct Arg<std::optional<at::Device>> {
  std::optional<at::Device> native;
  Arg(NativeCall& call, std::optional<at::Device> d) {
    if (d.has_value()) native = call.device_arg(*d);
  }
  std::optional<at::Device> get(NativeCall&) { return native; }
};

template <>
struct Arg<std::optional<at::Generator>> {
  std::optional<at::Generator> flagos;
  Arg(NativeCall&, std::optional<at::Generator> g) : flagos(std::move(g)) {}
  std::optional<at::Generator> get(NativeCall& call) { return call.generator(flagos); }
};

// ---- results ------------------------------------------------------------------

template <class R>
struct Result;  // only the result types below are supported

template <>
struct Result<at::Tensor> {
  template <class Args>
  static at::Tensor map(NativeCall& call, at::Tensor r, Args&) { return call.result(r); }
};

// A symbolic size (an attention kernel's max sequence lengths) passes through.
template <>
struct Result<c10::SymInt> {
  template <class Args>
  static c10::SymInt map(NativeCall&, c10::SymInt r, Args&) { return r; }
};

// A returned reference is one of the written arguments: the caller's own
// flagos tensor comes back.
template <>
struct Result<at::Tensor&> {
  template <class Args>
  static at::Tensor& map(NativeCall&, at::Tensor& r, Args& args) {
    at::Tensor* found = nullptr;
    std::apply([&](auto&... a) { (match(a, r, found), ...); }, args);
    TORCH_INTERNAL_ASSERT(found != nullptr, "unboxed route: a returned reference is no argument");
    return *found;
  }

 private:
  template <class A>
  static void match(A&, const at::Tensor&, at::Tensor*&) {}
  static void match(Arg<at::Tensor&>& a, const at::Tensor& r, at::Tensor*& found) {
    if (found == nullptr && a.native.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) {
      found = a.flagos;
    }
  }
};

template <class... Rs>
struct Result<std::tuple<Rs...>> {
  template <class Args>
  static std::tuple<Rs...> map(NativeCall& call, std::tuple<Rs...> r, Args& args) {
    return std::apply(
        [&](auto&&... e) {
          return std::tuple<Rs...>(Result<Rs>::map(call, std::forward<decltype(e)>(e), args)...);
        },
        std::move(r));
  }
};

template <>
struct Result<std::vector<at::Tensor>> {
  template <class Args>
  static std::vector<at::Tensor> map(NativeCall& call, std::vector<at::Tensor> r, Args&) {
    for (auto& t : r) t = call.result(t);
    return r;
  }
};

// ---- the kernel -----------------------------------------------------------------

// Whether the plan lets an unboxed route serve the call itself.
inline bool serves_unboxed(const OpPlan& plan) noexcept {
  return plan.route_epoch.load(std::memory_order_acquire) == routing::epoch() &&
         plan.native_route.load(std::memory_order_relaxed) && !routing::boxed_only();
}

// The boxed routing kernel for one operator whose plan is known: a call the
// unboxed route hands over skips the plan lookup.
struct PlannedRoute final : c10::OperatorKernel {
  explicit PlannedRoute(OpPlan& p) : plan(p) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    route_planned(op, plan, stack);
  }
  OpPlan& plan;
};

// What an unboxed route looks up once: its operator, plan and boxed fallback.
struct RouteState {
  explicit RouteState(const char* name, const char* overload)
      : op(c10::Dispatcher::singleton().findSchemaOrThrow(name, overload)),
        plan(plan_for(op)),
        boxed(c10::BoxedKernel::makeFromFunctor(std::make_unique<PlannedRoute>(plan))) {}
  const c10::OperatorHandle op;
  OpPlan& plan;
  const c10::BoxedKernel boxed;
};

template <class Op, class Schema = typename Op::schema>
struct UnboxedRoute;

template <class Op, class Ret, class... Args>
struct UnboxedRoute<Op, Ret(Args...)> {
  static Ret call(c10::DispatchKeySet keys, Args... args) {
    static const RouteState state(Op::name, Op::overload_name);  // leaked with the process
    const c10::OperatorHandle& op = state.op;
    OpPlan& plan = state.plan;
    if (!serves_unboxed(plan)) {
      return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(state.boxed, op, keys,
                                                                std::forward<Args>(args)...);
    }
    plan.calls[static_cast<int>(plan.backend.load(std::memory_order_relaxed))].fetch_add(
        1, std::memory_order_relaxed);
    NativeCall call(op);
    // Braced initialisation: arguments are converted left to right.
    std::tuple<Arg<Args>...> native{Arg<Args>(call, std::forward<Args>(args))...};
    call.finish_arguments();
    auto kernel = [&]() -> Ret {
      return std::apply(
          [&](auto&... a) -> Ret { return Op::redispatch(NativeCall::native_keys(), a.get(call)...); },
          native);
    };
    if constexpr (std::is_void_v<Ret>) {
      call.run_self_guarded(kernel);
      call.sync_written();
    } else {
      decltype(auto) r = call.run_self_guarded(kernel);
      call.sync_written();
      return Result<std::remove_const_t<Ret>>::map(call, std::forward<decltype(r)>(r), native);
    }
  }
};

}  // namespace torch_fl::aten::unboxed
