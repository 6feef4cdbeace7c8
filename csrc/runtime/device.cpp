#include "runtime/device.h"

#include "runtime/cuda_bridge.h"

#include <atomic>
#include <mutex>
#include <string>
#include <pthread.h>

#include <c10/util/Exception.h>

namespace torch_fl::runtime {
namespace {

std::atomic<bool> g_initialized{false};
std::atomic<bool> g_in_bad_fork{false};

void on_fork_child() {
  if (g_initialized.load()) g_in_bad_fork.store(true);
}

}  // namespace

void lazy_init() {
  if (g_initialized.load(std::memory_order_acquire)) {
    TORCH_CHECK(!g_in_bad_fork.load(),
                // CUDA's words, with flagos for CUDA.
                "Cannot re-initialize flagos in forked subprocess. To use flagos with "
                "multiprocessing, you must use the 'spawn' start method "
                "(torch.multiprocessing.set_start_method('spawn')): the parent process had "
                "initialised flagos before it forked.");
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    driver();  // selects and validates the driver; throws on bad config
    // The cuda driver's memory and streams are PyTorch's CUDA ones: they must
    // be initialised as torch.cuda would, whichever touches the GPU first.
    if (uses_cuda()) cuda::lazy_init();
    pthread_atfork(nullptr, nullptr, on_fork_child);
    g_initialized.store(true, std::memory_order_release);
  });
}

bool is_initialized() noexcept { return g_initialized.load(); }

bool is_in_bad_fork() noexcept { return g_in_bad_fork.load(); }

c10::DeviceIndex device_count() noexcept {
  try {
    return static_cast<c10::DeviceIndex>(driver().deviceCount());
  } catch (...) {
    return 0;
  }
}

void check_device_index(c10::DeviceIndex index) {
  const int n = device_count();
  if (index >= 0 && index < n) return;
  // Built as a std::string first: the message is assembled once, off the
  // hot path, with nothing but standard string operations.
  // Opens with the words of PyTorch's reference backend (torch_openreg).
  std::string msg = "The device index is out of range: flagos device index " +
                    std::to_string(static_cast<int>(index)) + " does not exist; this process has " +
                    std::to_string(n) + " flagos device(s), valid indices are 0.." +
                    std::to_string(n - 1);
  if (std::string(driver().name()) == "host") {
    msg += " (the host driver's count is set by FLAGOS_HOST_DEVICES)";
  }
  TORCH_CHECK(false, msg);
}

c10::DeviceIndex resolve_device(c10::DeviceIndex index) {
  // Only -1 means "current": another negative index is a mistake (or a
  // "flagos:128" that PyTorch wrapped into int8).
  if (index == -1) return current_device();
  check_device_index(index);
  return index;
}

c10::DeviceIndex current_device() {
  lazy_init();
  return static_cast<c10::DeviceIndex>(driver().currentDevice());
}

void set_device(c10::DeviceIndex index) {
  lazy_init();
  check_device_index(index);
  driver().setDevice(index);
}

}  // namespace torch_fl::runtime
