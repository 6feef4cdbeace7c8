#pragma once

// Flagos memory shared with other processes (torch.multiprocessing).
//
// PyTorch's reducers (torch/multiprocessing/reductions.py) share CPU memory
// through shared-memory segments and CUDA memory through CUDA IPC. The Python
// side (torch_fl/flagos/_sharing.py) hands them native tensors over flagos
// memory and turns what arrives into flagos tensors again, so that both sides
// use the same bytes, as with CPU and CUDA tensors:
//  - cuda driver: flagos memory is CUDA caching-allocator memory, so a CUDA
//    tensor over it travels by CUDA IPC as it is. The CUDA storage sent keeps
//    the flagos storage alive, and PyTorch's IPC reference counting keeps that
//    storage until every receiver has let go of the memory.
//  - host driver: flagos memory is private to the process, so a storage moves,
//    on its first trip, into a CPU shared-memory segment (what CPU tensors'
//    share_memory_() does) and uses the segment from then on.

#include <optional>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace torch_fl::ipc {

// The whole storage of flagos tensor `t` as a 1-D uint8 tensor of the native
// device type (CUDA or CPU) that keeps the storage alive. Memory received from
// another process by CUDA IPC is refused, as CUDA refuses it: it can be opened
// by one process only.
at::Tensor native_bytes(const at::Tensor& t);

// A 1-D uint8 flagos tensor on flagos `device` over all of the storage of
// native tensor `native`, keeping it alive. `received`: memory that came from
// another process (see native_bytes).
at::Tensor flagos_bytes(const at::Tensor& native, c10::DeviceIndex device, bool received);

// Host driver. The CPU shared-memory segment that `t`'s storage uses, as a
// uint8 CPU tensor, with the sharing strategy it was made for
// ("file_descriptor" or "file_system"); none when the storage uses none.
std::optional<std::pair<at::Tensor, std::string>> host_segment(const at::Tensor& t);

// Host driver. Copies `t`'s storage into `segment`, a uint8 CPU tensor over a
// shared-memory segment of the same size made for `strategy`, and makes the
// storage use the segment from now on. As with share_memory_() on the CPU,
// the storage's old memory is freed: a pointer taken to it earlier is stale.
void host_move_into(const at::Tensor& t, const at::Tensor& segment, std::string strategy);

// Host driver. A 1-D uint8 flagos tensor on flagos `device` that uses
// `segment` as host_move_into leaves a storage using it.
at::Tensor host_adopt(const at::Tensor& segment, c10::DeviceIndex device, std::string strategy);

}  // namespace torch_fl::ipc
