#pragma once

// The FlagGems JIT functions the family planners launch, found in FlagGems'
// sources through Python once per process (export), then read lock-free.
//  - KernelSlot: one @triton.jit function of an ops/*.py module, with the
//    parameter names its planner writes (checked against the export, so a
//    FlagGems whose kernel changed disables that planner, loudly, once);
//  - PointwiseSlot: one PointwiseDynamicFunction and its generated
//    rank-N kernels;
//  - TunerSlot: an autotuned kernel's tuner-key -> config table, learned from
//    FlagGems' own choice (a captured launch) or the disk cache.

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "flaggems/python_side.h"
#include "flaggems/triton_abi.h"

namespace torch_fl::flaggems {

struct JitFn {
  uint16_t id = 0;
  std::string ref;
  std::string cache_key;
  std::vector<std::string> names;
  std::vector<abi::ParamInfo> params;
  int param_count() const noexcept { return static_cast<int>(params.size()); }
};

// Slot states.
enum class SlotState : uint8_t { kUnresolved = 0, kReady = 1, kFailed = 2 };

struct KernelSlot {
  const char* module;     // "flag_gems.ops.softmax"
  const char* qualname;   // "softmax_kernel_inner"
  std::vector<const char*> names;  // the parameters the planner writes, in order
  std::atomic<const JitFn*> fn{nullptr};
  std::atomic<SlotState> state{SlotState::kUnresolved};

  KernelSlot(const char* m, const char* q, std::vector<const char*> n)
      : module(m), qualname(q), names(std::move(n)) {}
  const JitFn* get() const noexcept { return fn.load(std::memory_order_acquire); }
};

inline constexpr int kMaxPointwiseRank = 5;

struct PointwiseSlot {
  const char* module;     // "flag_gems.ops.add"
  const char* name;       // "add_func"
  std::atomic<const PointwiseInfo*> info{nullptr};
  std::atomic<SlotState> state{SlotState::kUnresolved};
  std::array<std::atomic<const JitFn*>, kMaxPointwiseRank + 1> rank_fn{};
  std::array<std::atomic<SlotState>, kMaxPointwiseRank + 1> rank_state{};

  PointwiseSlot(const char* m, const char* n) : module(m), name(n) {}
};

inline constexpr int kMaxTuned = 6;
// The longest tuner key (key arguments and tensor dtypes) a table holds.
inline constexpr int kMaxTunerKey = 12;

struct TunedConfig {
  int64_t values[kMaxTuned] = {};
  uint8_t num_warps = 4, num_stages = 3;
};

// Lock-free reads, inserts under a mutex; entries are never removed.
class TunerTable {
 public:
  const TunedConfig* find(const int64_t* key, int n) const noexcept;
  void insert(const int64_t* key, int n, const TunedConfig& cfg);

 private:
  struct Entry {
    int n;
    int64_t key[kMaxTunerKey];
    TunedConfig cfg;
  };
  static constexpr int kCapacity = 1024;
  std::array<std::atomic<const Entry*>, kCapacity> slots_{};
  std::mutex mu_;
};

struct TunerSlot {
  KernelSlot* kernel;
  std::vector<const char*> params;  // the tuned constexpr parameters
  TunerTable table;
  TunerSlot(KernelSlot* k, std::vector<const char*> p) : kernel(k), params(std::move(p)) {}
};

// Slow path (takes the GIL): exports the slot's function. False when it cannot
// be served (no Python side, FlagGems lacks it, its parameters changed).
bool resolve(KernelSlot& slot);
bool resolve(PointwiseSlot& slot);
bool resolve_rank(PointwiseSlot& slot, int rank);  // rank 0: the layout only

const JitFn* jit_fn(int id) noexcept;

// Warns once per process and key: FlagGems' code differs from what a planner
// expects, a verification failed, ...
void warn_once(const std::string& key, const std::string& message);

// The Triton version Python reported (for the disk cache keys).
void set_triton_version(std::string v);
const std::string& triton_version();

}  // namespace torch_fl::flaggems
