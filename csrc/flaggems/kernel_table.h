#pragma once

// Compiled FlagGems kernels by kernel key (triton_abi.h): read lock-free on
// every call, written on the slow path only. An entry is a kernel ready to
// launch, or a key pinned to FlagGems' Python wrapper (its plan did not match
// what the wrapper launched), or a key to capture again (the capture was
// inconclusive, e.g. the autotuner benchmarked during it).

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "flaggems/cuda_launch.h"
#include "flaggems/python_side.h"
#include "flaggems/triton_abi.h"

namespace torch_fl::flaggems {

enum class KernelState : uint8_t { kReady, kPinned, kRetry };

struct Kernel {
  abi::Key key;
  std::atomic<KernelState> state{KernelState::kRetry};
  std::atomic<int> attempts{0};
  KernelBinary binary;
  uint8_t sizes[abi::kMaxParams + abi::kScratchParams];
  int count = 0;  // packed parameters (for the load-time check)
  std::mutex load_mu;   // loading per device
  std::mutex admit_mu;  // one admission (or pin) at a time
  std::array<std::atomic<void*>, 64> function{};  // CUfunction per device

  // The CUfunction for `device`, loading the module on first use. Throws with
  // the reason when the binary does not load or its ABI differs.
  void* function_for(int device, const char* op);
};

class KernelTable {
 public:
  Kernel* find(const abi::Key& key) const noexcept;
  // Inserts (or returns the existing entry for) `key`; null when full.
  Kernel* insert(const abi::Key& key);
  size_t size() const noexcept { return size_.load(); }

 private:
  static constexpr size_t kCapacity = 1 << 14;
  std::array<std::atomic<Kernel*>, kCapacity> slots_{};
  std::atomic<size_t> size_{0};
  std::mutex mu_;
};

KernelTable& kernels();

}  // namespace torch_fl::flaggems
