#pragma once

// The hardware abstraction layer: one interface that every accelerator driver
// implements. Nothing here depends on torch, so drivers are unit-tested alone
// and a vendor adds a chip by adding a driver (docs/adding-a-driver.md).
//
// Contract shared by every method:
//  - device indices are validated by the caller (runtime/device.h); a driver
//    may assume 0 <= device < deviceCount();
//  - failures throw hal::Error (a std::runtime_error) with a message a user can
//    act on; allocate() is the one exception: it returns nullptr when the
//    device has no room, so that the caching allocator can free and retry.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

namespace torch_fl::hal {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A bad configuration value (environment variable, argument): maps to Python's
// ValueError at the binding layer.
struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Which of PyTorch's native device types owns the driver's memory. The ATen
// layer uses it to build zero-copy native views of flagos tensors.
enum class NativeDevice { kHost, kCuda };

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// Opaque handles owned by the driver.
using StreamHandle = void*;
using EventHandle = void*;

struct MemoryInfo {
  size_t free_bytes;
  size_t total_bytes;
};

class Driver {
 public:
  virtual ~Driver() = default;

  // "host", "cuda", ... : the value FLAGOS_ACCELERATOR selects it by.
  virtual std::string_view name() const noexcept = 0;
  virtual NativeDevice nativeDevice() const noexcept = 0;

  // ---- devices --------------------------------------------------------
  virtual int deviceCount() const noexcept = 0;
  // Makes `device` current for the calling thread (native context included).
  virtual void setDevice(int device) = 0;
  virtual int currentDevice() const = 0;
  // Blocks until all work on every stream of `device` has finished.
  virtual void synchronizeDevice(int device) = 0;

  // ---- memory ---------------------------------------------------------
  // Returns nullptr when the device cannot hold `nbytes` more bytes.
  virtual void* allocate(int device, size_t nbytes) = 0;
  // `nbytes` is the size given to allocate().
  virtual void deallocate(int device, void* ptr, size_t nbytes) noexcept = 0;
  virtual MemoryInfo memoryInfo(int device) const = 0;
  // Whether the machine is short of memory for `nbytes` more, although
  // allocate() might still succeed: a caching allocator then gives its cache
  // back first. A device whose allocate() fails when it is full needs no such
  // signal (the default).
  virtual bool memoryIsShort(int /*device*/, size_t /*nbytes*/) const { return false; }
  // Copies `nbytes`. With async=false it returns when the copy is done; with
  // async=true it is ordered on `stream` and may still be running.
  virtual void copy(void* dst, const void* src, size_t nbytes, CopyKind kind,
                    StreamHandle stream, bool async) = 0;

  // ---- streams ----------------------------------------------------------
  // The default stream of a device. Never destroyed.
  virtual StreamHandle defaultStream(int device) = 0;
  // priority: 0 is normal, negative is higher (CUDA's convention).
  virtual StreamHandle createStream(int device, int priority) = 0;
  virtual void destroyStream(StreamHandle stream) noexcept = 0;
  // True when all work submitted to `stream` has finished.
  virtual bool queryStream(StreamHandle stream) = 0;
  virtual void synchronizeStream(StreamHandle stream) = 0;

  // ---- events -----------------------------------------------------------
  virtual EventHandle createEvent(int device, bool enable_timing) = 0;
  virtual void destroyEvent(EventHandle event) noexcept = 0;
  // Captures the work submitted to `stream` so far.
  virtual void recordEvent(EventHandle event, StreamHandle stream) = 0;
  // True when the captured work has finished (also for a never-recorded event).
  virtual bool queryEvent(EventHandle event) = 0;
  virtual void synchronizeEvent(EventHandle event) = 0;
  // Work submitted to `stream` after this call waits for `event`.
  virtual void streamWaitEvent(StreamHandle stream, EventHandle event) = 0;
  // Milliseconds between two recorded timing events; throws otherwise.
  virtual double elapsedMs(EventHandle start, EventHandle end) = 0;
};

// The driver of this process, chosen once by FLAGOS_ACCELERATOR
// (host | cuda | auto; auto prefers a usable GPU). Throws ConfigError for an
// unknown value and Error when the named driver cannot run here.
Driver& driver();

namespace detail {
extern std::atomic<Driver*> g_driver;
}
// driver() without the selection step, for hot paths that run only after the
// device is in use (the driver is then selected).
inline Driver& selected_driver() {
  Driver* d = detail::g_driver.load(std::memory_order_acquire);
  return d != nullptr ? *d : driver();
}

// Registers a driver other than host; called from a driver's translation unit
// at static-initialisation time. The factory returns nullptr when the hardware
// is not usable on this machine, with the reason in *why.
using Factory = std::unique_ptr<Driver> (*)(std::string* why);
bool register_driver(const char* name, Factory factory);

// Names of the drivers built into this library, for error messages and `info`.
std::string available_drivers();

}  // namespace torch_fl::hal
