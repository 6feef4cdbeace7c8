#pragma once

// What a family planner produces for one operator call: the kernel launches
// (JIT function, grid, warps, every argument in parameter order) and the
// results, with outputs already allocated as flagos tensors. Planners read
// tensor metadata only; they never read tensor data, so no plan needs a
// device sync. Everything here lives on the stack of the call.

#include <cstdint>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/util/SmallVector.h>

#include "flaggems/registry.h"
#include "flaggems/triton_abi.h"

namespace torch_fl::flaggems {

inline constexpr int kMaxLaunches = 2;

// The Triton element type of a tensor's dtype; kInvalid for dtypes the
// planners do not serve.
abi::TType elem_type(c10::ScalarType t) noexcept;

struct Launch {
  const JitFn* fn = nullptr;
  uint32_t grid[3] = {1, 1, 1};
  uint8_t num_warps = 4;
  uint8_t num_stages = 3;
  uint8_t n = 0;  // arguments written so far
  abi::Value args[abi::kMaxParams];

  void start(const JitFn* f) noexcept {
    fn = f;
    n = 0;
  }
  void ptr(const at::Tensor& t) noexcept {
    args[n++] = abi::Value::pointer(reinterpret_cast<uint64_t>(t.data_ptr()),
                                    elem_type(t.scalar_type()));
  }
  void i(int64_t v) noexcept { args[n++] = abi::Value::integer(v); }
  void f(double v) noexcept { args[n++] = abi::Value::floating(v); }
  void b(bool v) noexcept { args[n++] = abi::Value::boolean(v); }
  void none() noexcept { args[n++] = abi::Value::none(); }
  void value(const abi::Value& v) noexcept { args[n++] = v; }
};

enum class Outcome : uint8_t {
  kPlanned,     // launches ready
  kDecline,     // outside the planner's domain: FlagGems' Python wrapper (or native) serves it
  kNeedExport,  // a JIT function is not exported yet: slow path, then plan again
  kNeedTuning,  // an autotuned kernel has no config for this tuner key yet
  kNative,      // FlagGems' wrapper is known to fail on these arguments: the native kernel serves it
};

struct CallPlan {
  uint8_t nlaunches = 0;
  Launch launches[kMaxLaunches];
  // Tensors the launches use that must live until they are enqueued
  // (contiguous copies, buffers); the caching allocator's stream order makes
  // freeing them right after the launch safe.
  c10::SmallVector<at::Tensor, 4> keep;
  // The operator's results, in schema order.
  c10::SmallVector<c10::IValue, 2> results;
  // Work after the launches (a cast or a copy into the result), if any.
  void (*post)(CallPlan&) = nullptr;
  at::Tensor post_src, post_dst;
  // Slow-path requests.
  KernelSlot* need_slot = nullptr;
  PointwiseSlot* need_pointwise = nullptr;
  int need_rank = 0;
  TunerSlot* need_tuner = nullptr;
  int64_t tuner_key[kMaxTunerKey];
  int tuner_key_len = 0;

  Launch& add_launch() noexcept { return launches[nlaunches++]; }
};

struct OpDesc;

// The arguments of one call, as the boxed kernel holds them, and helpers to
// allocate flagos tensors the way FlagGems' wrappers allocate CUDA ones.
class Call {
 public:
  Call(const c10::IValue* args, int nargs) noexcept : args_(args), nargs_(nargs) {}

  const c10::IValue& arg(int i) const noexcept { return args_[i]; }
  int nargs() const noexcept { return nargs_; }
  // A defined flagos tensor argument on the call's device (the first one
  // fixes it); nullptr when the argument is anything else.
  const at::Tensor* tensor(int i) noexcept { return tensor_value(args_[i]); }
  // The same for an element of a Tensor[] argument.
  const at::Tensor* tensor_value(const c10::IValue& v) noexcept;
  c10::DeviceIndex device() const noexcept { return device_; }

  // Autotuned kernels: the config for `key`, or nullptr after recording the
  // request in `plan` (the planner then returns kNeedTuning).
  const TunedConfig* tuned(TunerSlot& tuner, const int64_t* key, int n, CallPlan& plan) const;

  // Allocation, as torch.empty / torch.empty_like / torch.empty_strided on
  // the call's device (flagos memory, the current stream).
  at::Tensor empty(c10::IntArrayRef sizes, c10::ScalarType dtype) const;
  at::Tensor empty_strided(c10::IntArrayRef sizes, c10::IntArrayRef strides,
                           c10::ScalarType dtype) const;
  at::Tensor empty_like(const at::Tensor& t, c10::ScalarType dtype) const;
  // t.contiguous(): t itself when contiguous, else a copy (kept in `plan`).
  at::Tensor contiguous(const at::Tensor& t, CallPlan& plan) const;
  // torch.zeros: zero-filled on the current stream.
  at::Tensor zeros(c10::IntArrayRef sizes, c10::ScalarType dtype) const;

 private:
  const c10::IValue* args_;
  int nargs_;
  c10::DeviceIndex device_ = -1;
};

// A view of `base`'s storage with the given geometry (no dispatch, no
// autograd view tracking: for tensors an operator returns or uses internally).
at::Tensor view_of(const at::Tensor& base, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                   int64_t storage_offset);
// view_of `t` with its dimensions in `order` (t.permute(order)).
at::Tensor permuted(const at::Tensor& t, const int64_t* order);
// view_of `t` with `dim` moved last and the others in order: FlagGems'
// dim_compress(t, dim) before its .contiguous().
at::Tensor dim_last(const at::Tensor& t, int64_t dim);

// A CallPlan::post that copies post_src into post_dst (flagos' own copy).
void post_copy(CallPlan& plan);

using Planner = Outcome (*)(const OpDesc& op, Call& call, CallPlan& plan);

// One aten overload served by a family planner.
struct OpDesc {
  const char* aten;         // "add.Tensor"
  Planner planner;
  const void* family;       // the planner's own description of the op
  // Counters (routing stats read the per-OpPlan ones; these are for
  // torch_fl.flaggems.cpp_stats()).
  mutable std::atomic<uint64_t> launched{0};
  mutable std::atomic<uint64_t> captured{0};
  mutable std::atomic<uint64_t> declined{0};
};

// The op table (ops.cpp): every aten overload with a C++ description.
OpDesc* op_table(size_t* count);

}  // namespace torch_fl::flaggems
