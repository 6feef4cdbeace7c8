#pragma once

// Host driver: flagos memory in CPU shared-memory segments, so that
// torch.multiprocessing can share it (torch_fl/flagos/_sharing.py).
//
// Host-driver memory is private to the process. A storage moves, once, into a
// segment that PyTorch made for CPU sharing (MapAllocator memory of one
// sharing strategy), which PyTorch's CPU reducers then send without copying;
// a receiver's flagos storage uses the segment it gets. A storage in a segment
// is not resizable, as CPU shared storages are not: new memory would silently
// stop being shared.

#include <optional>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>

namespace torch_fl::ipc {

// The segment that flagos tensor `t`'s storage uses, as a 1-D uint8 CPU tensor
// over all of it, with the sharing strategy it was made for
// ("file_descriptor" or "file_system"); none when the storage uses none.
std::optional<std::pair<at::Tensor, std::string>> host_segment(const at::Tensor& t);

// Copies `t`'s storage into `segment` (a 1-D uint8 CPU tensor over a whole
// segment of the same size, made for `strategy`) and makes the storage use it
// from now on. As with share_memory_() on the CPU, the old memory is freed:
// anything still pointing at it (a DLPack or NumPy alias) is stale.
void host_move_into(const at::Tensor& t, const at::Tensor& segment, std::string strategy);

// A 1-D uint8 flagos tensor on flagos `device` whose storage uses `segment`
// (received from another process) as host_move_into leaves a storage using it.
at::Tensor host_adopt(const at::Tensor& segment, c10::DeviceIndex device, std::string strategy);

}  // namespace torch_fl::ipc
