#pragma once

// What both kinds of shared flagos memory (host_segments.h, native_memory.h)
// need: whole storages as byte tensors, and the checks on what they are given.

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

namespace torch_fl::ipc {

// A 1-D uint8 tensor over all of `storage`, dispatching to `key`.
at::Tensor bytes_over(c10::Storage storage, c10::DispatchKey key);

// Refuses what is not a dense flagos tensor, naming it; `what` says which argument.
void check_flagos(const at::Tensor& t, const char* what);

// Refuses a call meant for the other driver.
void check_driver(bool host, const char* what);

// A storage shared with another process: resizing it would give it new,
// unshared memory (a kernel growing an out= view included, through its twin).
void make_unresizable(c10::StorageImpl& storage);

}  // namespace torch_fl::ipc
