#pragma once

// The one place that knows which torch release it is built against. One source
// tree builds against torch 2.11 (GPU machines) and 2.13/2.14 (CI); code that
// differs between them tests these macros and nothing else.

#include <torch/version.h>

#define FLAGOS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||         \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

static_assert(FLAGOS_TORCH_AT_LEAST(2, 11),
              "torch_fl needs torch 2.11 or newer");

// Named tensors (Tensor::has_names) were removed in torch 2.13.
#define FLAGOS_TORCH_HAS_NAMED_TENSORS (!FLAGOS_TORCH_AT_LEAST(2, 13))

// DeviceGuardImplInterface::getDeviceCapability (torch.accelerator.
// get_device_capability) arrived in torch 2.10; kept behind a macro so that the
// one place to look stays this header.
#define FLAGOS_TORCH_HAS_DEVICE_CAPABILITY FLAGOS_TORCH_AT_LEAST(2, 10)

// at::HostAllocator with its statistics (HostStats) and at::setHostAllocator:
// torch.accelerator's host-memory functions call the device type's. Checked
// against the 2.13 and 2.14 headers; 2.11's (the GPU machines') not yet.
#define FLAGOS_HAS_HOST_ALLOCATOR FLAGOS_TORCH_AT_LEAST(2, 13)
