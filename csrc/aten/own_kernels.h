#pragma once

// Operators flagos serves on every driver with kernels of its own, which touch
// allocation, metadata and copies only (core_ops.cpp, copy.cpp): they never
// reach routing, so a route for one would be accepted and change nothing.
// Registering them through impl_own() records them for routing's check
// (routing/table.cpp, never_routed_message).

#include <utility>

#include <ATen/core/operator_name.h>
#include <torch/library.h>

namespace torch_fl::aten {

// Records `name` ("copy_", "set_.source_Storage") as an aten operator with a
// kernel of flagos' own. Called during static registration only.
void note_own_kernel(const char* name);

template <class Func>
void impl_own(torch::Library& m, const char* name, Func&& f) {
  note_own_kernel(name);
  m.impl(name, std::forward<Func>(f));
}

// Whether `op` was registered through impl_own().
bool is_own_kernel(const c10::OperatorName& op);

}  // namespace torch_fl::aten
