#pragma once

// How much more memory this process can take from the machine before the
// kernel's OOM killer ends it: the smaller of /proc/meminfo's MemAvailable and
// the headroom of the process's memory cgroup (v2 or v1), where either is
// known. The host driver's allocations succeed (Linux overcommits) until that
// kill, so its caching allocator asks this instead of waiting for a failure.

#include <cstddef>
#include <optional>
#include <string_view>

namespace torch_fl::hal {

// Bytes available; SIZE_MAX when the machine says nothing readable.
size_t system_available_memory();

// The parts, for tests: MemAvailable from /proc/meminfo's text (it is given
// in kB), and a cgroup's headroom from its limit file ("max" is none) and its
// usage file.
std::optional<size_t> meminfo_available(std::string_view meminfo);
std::optional<size_t> cgroup_headroom(std::string_view limit, std::string_view usage);

}  // namespace torch_fl::hal
