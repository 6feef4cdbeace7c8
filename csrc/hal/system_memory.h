#pragma once

// How much more memory this process can take from the machine before the
// kernel's OOM killer ends it: the smaller of /proc/meminfo's MemAvailable and
// the headroom of every memory cgroup limit above the process (v2 or v1),
// where any is known. The host driver's allocations succeed (Linux
// overcommits) until that kill, so its caching allocator asks this instead of
// waiting for a failure.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torch_fl::hal {

// Bytes available; SIZE_MAX when the machine says nothing readable. Exact up
// to `enough`: a figure above it may be a lower bound (a group's page cache is
// read only when the group is close to its limit). A few small /proc and /sys
// reads (MemAvailable, the usage of each limited group); the limited groups
// and their limits are found once per process.
size_t system_available_memory(size_t enough = SIZE_MAX);

// For tests: make system_available_memory() return `bytes` (nullopt: read the
// machine again).
void override_available_memory(std::optional<size_t> bytes);

// The parts, for tests.
// MemAvailable from /proc/meminfo's text (given in kB).
std::optional<size_t> meminfo_available(std::string_view meminfo);
// A cgroup's headroom: its limit file ("max": none) less its working set, the
// usage file less the inactive file cache its memory.stat gives under
// `inactive_key` (v2: inactive_file, v1: total_inactive_file; the kernel
// reclaims that cache before it kills), as the kubelet counts it.
std::optional<size_t> cgroup_headroom(std::string_view limit, std::string_view usage,
                                      std::string_view stat,
                                      std::string_view inactive_key = "inactive_file");
// The memory cgroup directories of a process, from its own group up to the
// hierarchy's root, given /proc/self/cgroup's text: the v2 group ("0::/path")
// under `v2_mount`, else the v1 memory group ("N:...memory...:/path") under
// `v1_mount`.
std::vector<std::string> cgroup_memory_dirs(std::string_view proc_self_cgroup,
                                            std::string_view v2_mount,
                                            std::string_view v1_mount);

}  // namespace torch_fl::hal
