#pragma once

// On the host driver, flagos kernels are PyTorch's CPU kernels run over
// zero-copy CPU views of flagos memory. The CPU tensors those kernels allocate
// (their outputs, and storages they grow) must be flagos memory too, or
// outputs would need a copy and escape the device's statistics and capacity.
//
// NativeAllocationScope routes, for the calling thread and its lifetime, every
// allocation through PyTorch's CPU allocator to the flagos device allocator
// (labelled kCPU, so the CPU kernels accept it). Outside a scope the CPU
// allocator behaves exactly as before: the wrapper forwards to it.

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace torch_fl::runtime {

class NativeAllocationScope {
 public:
  explicit NativeAllocationScope(c10::DeviceIndex device) noexcept;
  ~NativeAllocationScope();
  NativeAllocationScope(const NativeAllocationScope&) = delete;
  NativeAllocationScope& operator=(const NativeAllocationScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

// Installs the CPU-allocator wrapper (idempotent; done at library load).
void install_native_allocation();

// The allocator for storages of native views: the wrapper on the host driver
// (a CPU kernel that grows a view's storage, out= resize, then allocates
// flagos memory inside a scope), CUDA's caching allocator on the cuda driver.
c10::Allocator* native_allocator();

}  // namespace torch_fl::runtime
