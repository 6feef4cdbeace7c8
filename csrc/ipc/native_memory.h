#pragma once

// cuda driver: flagos memory sent by CUDA IPC (torch_fl/flagos/_sharing.py).
//
// flagos memory is CUDA caching-allocator memory, so a CUDA tensor over it
// travels through PyTorch's CUDA reducer as it is. The CUDA storage sent holds
// the flagos storage, and PyTorch's IPC reference counting holds the CUDA
// storage until every receiver has let go. The flagos storage is made
// unresizable when it is first sent: new memory would free the block that
// receivers map.

#include <ATen/core/Tensor.h>

namespace torch_fl::ipc {

// The whole storage of flagos tensor `t` as a 1-D uint8 CUDA tensor that keeps
// it alive. Memory received from another process is refused, as CUDA refuses
// it: it can be opened by one process only.
at::Tensor native_bytes_to_send(const at::Tensor& t);

// A 1-D uint8 flagos tensor on flagos `device` over all of the storage of
// `native`, a CUDA tensor received from another process, keeping it alive.
at::Tensor flagos_bytes_received(const at::Tensor& native, c10::DeviceIndex device);

}  // namespace torch_fl::ipc
