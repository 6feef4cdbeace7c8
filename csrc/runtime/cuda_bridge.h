#pragma once

// On the cuda driver, flagos memory, streams, events and generators *are*
// PyTorch's CUDA ones: the caching allocator, c10 CUDA streams (so
// torch.flagos and torch.cuda agree on the current stream), CUDA events and
// the CUDA generators. This bridge translates between the flagos and cuda
// device types; it is compiled only when torch_fl is built with CUDA
// (FLAGOS_WITH_CUDA), and every call site checks uses_cuda() first.

#include <c10/core/Allocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <ATen/core/Generator.h>

#include "hal/driver.h"

namespace torch_fl::runtime {

// True when the process runs the cuda driver (always false without CUDA).
// Decided once, when the driver is selected.
bool uses_cuda();

namespace cuda {

// Initialises PyTorch's CUDA state (allocator, streams) exactly once, shared
// with torch.cuda's own lazy initialisation.
void lazy_init();

// A guard that forwards every call to PyTorch's CUDA guard, translating
// device types both ways.
const c10::impl::DeviceGuardImplInterface& guard();

// The CUDA caching allocator, returning DataPtrs labelled flagos:N.
c10::DataPtr allocate(c10::DeviceIndex device, size_t nbytes);
bool owns(const c10::DataPtr& ptr);
c10::Allocator* native_allocator();  // the CUDA caching allocator itself
c10::CachingDeviceAllocator::DeviceStats stats(c10::DeviceIndex device);
void reset_peak(c10::DeviceIndex device);
void reset_accumulated(c10::DeviceIndex device);
void empty_cache();
void set_memory_fraction(c10::DeviceIndex device, double fraction);
double memory_fraction(c10::DeviceIndex device);
void record_stream(const c10::DataPtr& ptr, const c10::Stream& flagos_stream);

// The cudaStream_t of the current stream of `device`.
hal::StreamHandle current_stream_handle(c10::DeviceIndex device);

// Pinned host memory as torch.cuda pins it.
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

// Enqueues a kernel that spins for `cycles` GPU clock cycles on the current
// stream: timing code holds the stream with it while it queues the calls it
// times, so that events measure the calls back to back, without host gaps.
void spin(int64_t cycles);
// Whether the current stream is capturing a CUDA graph (nothing may sync).
bool capturing();

// CUDA's default generator of a device, and a new one.
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);

}  // namespace cuda
}  // namespace torch_fl::runtime
