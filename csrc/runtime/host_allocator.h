#pragma once

// Pinned (page-locked) host memory for flagos: what tensor.pin_memory() and
// DataLoader(pin_memory=True) allocate when flagos is the accelerator. The
// host driver's memory is host memory already, so "pinned" here means
// "registered": is_pinned() recognises every pointer inside a live block.

#include <c10/core/Allocator.h>

namespace torch_fl::runtime {

c10::Allocator* pinned_host_allocator();

// Makes it PrivateUse1's at::HostAllocator (the host driver; where torch has
// the interface, FLAGOS_HAS_HOST_ALLOCATOR).
void register_pinned_host_allocator();

// True when `ptr` points into a live pinned block.
bool is_pinned_ptr(const void* ptr);

}  // namespace torch_fl::runtime
