#include "runtime/native_allocation.h"

#include <mutex>

#include <c10/core/CPUAllocator.h>

#include "runtime/allocator.h"
#include "runtime/cuda_bridge.h"

namespace torch_fl::runtime {
namespace {

// -1: no scope; otherwise the flagos device to allocate on.
thread_local c10::DeviceIndex tls_scope_device = -1;

c10::DeleterFnPtr g_cpu_raw_deleter = nullptr;

void raw_free(void* ptr) {
  if (!free_if_owned(ptr)) g_cpu_raw_deleter(ptr);
}

class CapturingCpuAllocator final : public c10::Allocator {
 public:
  explicit CapturingCpuAllocator(c10::Allocator* cpu) : cpu_(cpu) {}

  c10::DataPtr allocate(size_t n) override {
    if (tls_scope_device >= 0) {
      return device_allocator().allocate_on(tls_scope_device, n,
                                            c10::DeviceType::CPU);
    }
    return cpu_->allocate(n);
  }

  // raw_deallocate can receive either source's pointers: flagos knows its own.
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* cpu_;
};

CapturingCpuAllocator* g_wrapper = nullptr;

}  // namespace

NativeAllocationScope::NativeAllocationScope(c10::DeviceIndex device) noexcept
    : previous_(tls_scope_device) {
  // Only the host driver's native device is the CPU. (On the cuda driver,
  // CPU allocations inside CUDA kernels are CPU memory and must stay so.)
  if (!uses_cuda()) tls_scope_device = device;
}

NativeAllocationScope::~NativeAllocationScope() {
  tls_scope_device = previous_;
}

void install_native_allocation() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* cpu = c10::GetCPUAllocator();
    g_cpu_raw_deleter = cpu->raw_deleter();
    g_wrapper = new CapturingCpuAllocator(cpu);
    // Priority above the default CPU allocator's so a later default
    // registration cannot silently remove the wrapper.
    c10::SetCPUAllocator(g_wrapper, /*priority=*/1);
  });
}

c10::Allocator* native_allocator() {
  if (uses_cuda()) return cuda::native_allocator();
  return g_wrapper;  // installed at load (below), before any kernel runs
}

// Installed at load: the wrapper is inert outside a scope, and installing it
// before any flagos kernel runs means no scope can miss it.
static const bool kInstalled = (install_native_allocation(), true);

}  // namespace torch_fl::runtime
