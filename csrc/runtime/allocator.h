#pragma once

// The flagos device allocator: a caching allocator over the driver's memory,
// with the statistics torch.flagos.memory_* and torch.accelerator.memory_*
// report. Contract:
//  - allocate() serves the current device and stream; a freed block is reused
//    only on the stream it was allocated on, or, when recordStream() named
//    other streams, once events show their work has finished;
//  - when the driver has no room, the cache is released and the allocation
//    retried; then c10::OutOfMemoryError (torch.OutOfMemoryError) is thrown
//    with the requested, free and cached bytes in its message;
//  - every DataPtr it returns frees back to it, whatever device label it
//    carries (owns() recognises them); those labelled with another device
//    type have context == data, as c10's raw_allocate requires.

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>

namespace torch_fl::runtime {

class FlagosAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  // Allocation on `device`, labelled with `label` (kCPU for the host driver's
  // native views; see native_allocation.h).
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes,
                           c10::DeviceType label);
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
  // The share (0 to 1) of `device`'s memory this process may hold from the
  // driver, cached blocks included, as torch.cuda's per-process memory
  // fraction: an allocation beyond it raises OutOfMemoryError. 1 lifts the cap.
  void setMemoryFraction(c10::DeviceIndex device, double fraction);
  double memoryFraction(c10::DeviceIndex device);

  // True when `ptr` came from this allocator.
  static bool owns(const c10::DataPtr& ptr) noexcept;
};

// Frees a raw pointer of an allocation labelled with a non-flagos device type
// (see allocate_on); false when the pointer is not one of ours.
bool free_if_owned(void* ptr) noexcept;

FlagosAllocator& device_allocator();

}  // namespace torch_fl::runtime
