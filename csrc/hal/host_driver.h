#pragma once

// The host driver: device memory is host memory, so `flagos` is a real device
// on any machine (CI, laptops). Work runs inline on the submitting thread, which
// makes every stream trivially in order; events still carry timestamps so that
// elapsed_time measures the work between two records.
//
// Configuration (read once, at construction):
//   FLAGOS_HOST_DEVICES=N          number of devices, 1..64 (default 1)
//   FLAGOS_HOST_MEMORY_LIMIT=SIZE  capacity of each device (default: none)

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "hal/driver.h"

namespace torch_fl::hal {

class HostDriver final : public Driver {
 public:
  // Reads the environment; throws ConfigError on a malformed value.
  HostDriver();
  // Throws ConfigError when FLAGOS_HOST_* holds a malformed value; run
  // whichever driver is chosen, so a mistake never hides behind another one.
  static void check_environment();
  // For tests: explicit device count and per-device capacity (nullopt: none).
  HostDriver(int device_count, std::optional<size_t> capacity);
  ~HostDriver() override;

  std::string_view name() const noexcept override { return "host"; }
  NativeDevice nativeDevice() const noexcept override {
    return NativeDevice::kHost;
  }

  int deviceCount() const noexcept override;
  void setDevice(int device) override;
  int currentDevice() const override;
  void synchronizeDevice(int device) override;

  void* allocate(int device, size_t nbytes) override;
  void deallocate(int device, void* ptr, size_t nbytes) noexcept override;
  MemoryInfo memoryInfo(int device) const override;
  // allocate() fails only at the configured capacity (if any), and otherwise
  // succeeds until the OOM killer strikes: memory is short when the machine
  // (or a cgroup limit above the process) has less than `nbytes` available.
  bool memoryIsShort(int device, size_t nbytes) const override;
  void copy(void* dst, const void* src, size_t nbytes, CopyKind kind,
            StreamHandle stream, bool async) override;

  StreamHandle defaultStream(int device) override;
  StreamHandle createStream(int device, int priority) override;
  void destroyStream(StreamHandle stream) noexcept override;
  bool queryStream(StreamHandle stream) override;
  void synchronizeStream(StreamHandle stream) override;

  EventHandle createEvent(int device, bool enable_timing) override;
  void destroyEvent(EventHandle event) noexcept override;
  void recordEvent(EventHandle event, StreamHandle stream) override;
  bool queryEvent(EventHandle event) override;
  void synchronizeEvent(EventHandle event) override;
  void streamWaitEvent(StreamHandle stream, EventHandle event) override;
  double elapsedMs(EventHandle start, EventHandle end) override;

 private:
  struct Device;
  std::vector<std::unique_ptr<Device>> devices_;
  std::optional<size_t> capacity_;
};

}  // namespace torch_fl::hal
