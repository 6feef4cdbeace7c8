#pragma once

// flagos streams as c10::Streams. A c10 StreamId indexes a per-device table of
// driver stream handles:
//   0                    the default stream
//   1 .. kPoolSize       the normal-priority pool (handed out round-robin)
//   kPoolSize+1 .. 2*kPoolSize  the high-priority pool
// getNewStream takes from the pools, as CUDA's does: there are no others.
// The current stream is per thread and per device, as in CUDA.

#include <c10/core/Stream.h>

#include "hal/driver.h"

namespace torch_fl::runtime {

constexpr int kStreamPoolSize = 32;

c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream pool_stream(c10::DeviceIndex device, bool high_priority);
c10::Stream new_stream(c10::DeviceIndex device, int priority);

c10::Stream current_stream(c10::DeviceIndex device);
// The current stream id of a device already known to be valid (hot paths).
c10::StreamId current_stream_id_unchecked(c10::DeviceIndex device) noexcept;
// Makes `stream` current for its device on this thread; returns the previous.
c10::Stream exchange_stream(c10::Stream stream);

// The priority of a host-driver stream id (the cuda driver's streams are
// CUDA's, which know their own): -1 for the high-priority pool, else 0.
// The range is (kLeastPriority, kGreatestPriority), CUDA's order.
constexpr int kLeastPriority = 0;
constexpr int kGreatestPriority = -1;
int stream_priority(c10::StreamId id) noexcept;

// The driver handle behind a flagos stream; throws for an unknown id.
hal::StreamHandle stream_handle(const c10::Stream& stream);
// The driver handle of the current stream of `device` (any driver).
hal::StreamHandle current_stream_handle(c10::DeviceIndex device);

}  // namespace torch_fl::runtime
