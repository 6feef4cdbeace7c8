#pragma once

// Device bookkeeping shared by the runtime: index validation with messages a
// user can act on, the current device, and process-level initialisation.

#include <optional>

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>

#include "hal/driver.h"

namespace torch_fl::runtime {

constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

// The driver of this process (selected on first use; see hal::driver()).
inline hal::Driver& driver() { return hal::selected_driver(); }

c10::DeviceIndex device_count() noexcept;

// Throws c10::Error (RuntimeError, as CUDA and PyTorch's reference backend
// raise for a bad ordinal) naming the index and the valid range.
void check_device_index(c10::DeviceIndex index);

c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);

// Resolves -1 (meaning "current") and validates.
c10::DeviceIndex resolve_device(c10::DeviceIndex index);

// A guard that makes flagos device `index` current for its scope, or none when
// it is current already: the guard's exchange and restore cost more than the
// rest of a small operator's bookkeeping.
inline std::optional<c10::DeviceGuard> guard_unless_current(c10::DeviceIndex index) {
  if (index == current_device()) return std::nullopt;
  return std::optional<c10::DeviceGuard>(std::in_place, c10::Device(kFlagos, index));
}

// True in a child process forked after the device was initialised; such a
// child must not touch the device (as with CUDA).
bool is_in_bad_fork() noexcept;
// True once the device has been used in this process.
bool is_initialized() noexcept;
// Initialises the driver and marks the process as having used the device.
void lazy_init();

}  // namespace torch_fl::runtime
