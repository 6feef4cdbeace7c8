#include "hal/system_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdint>

namespace torch_fl::hal {
namespace {

std::optional<size_t> parse_size(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  return value;
}

// The value after `key` at the start of a line of `text` ("key value").
std::optional<size_t> field(std::string_view text, std::string_view key) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ' ' || line[key.size()] == '\t')) {
      return parse_size(line.substr(key.size()));
    }
    at = end + 1;
  }
  return std::nullopt;
}

// A small /proc or /sys file, read into `buffer` with plain system calls:
// no stream and no heap, since this runs under the allocator's lock, and one
// small buffer reused, since it may run on a thread with a small stack. A
// file longer than the buffer is cut short: a key past the cut is not found.
using Buffer = std::array<char, 4096>;
std::optional<std::string_view> read_small(const char* path, Buffer& buffer) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  size_t n = 0;
  while (n < buffer.size()) {
    const ssize_t got = ::read(fd, buffer.data() + n, buffer.size() - n);
    if (got <= 0) break;
    n += static_cast<size_t>(got);
  }
  ::close(fd);
  return std::string_view(buffer.data(), n);
}

// The headroom under `limit` of a group using `usage`, `inactive` of it
// reclaimable page cache; nullopt without a limit or a usage.
std::optional<size_t> headroom_of(std::optional<size_t> limit, std::optional<size_t> usage,
                                  std::optional<size_t> inactive) {
  if (!limit || !usage) return std::nullopt;
  const size_t working = *usage - std::min(*usage, inactive.value_or(0));
  return *limit > working ? *limit - working : 0;
}

// A memory cgroup with a limit: the limit, read once (a limit changed while
// the process runs is not seen), and its files.
struct Cgroup {
  size_t limit;
  std::string usage, stat;
  const char* inactive_key;
};

// v1 writes its "no limit" as a huge number (LONG_MAX rounded to a page).
constexpr size_t kNoLimit = size_t{1} << 60;

std::vector<Cgroup> find_cgroups() {
  Buffer buffer;
  auto self = read_small("/proc/self/cgroup", buffer);
  if (!self) return {};
  std::vector<Cgroup> found;
  for (const std::string& dir :
       cgroup_memory_dirs(std::string(*self), "/sys/fs/cgroup", "/sys/fs/cgroup/memory")) {
    const bool v2 = ::access((dir + "/memory.max").c_str(), R_OK) == 0;
    auto text = read_small((dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes")).c_str(), buffer);
    const auto limit = text ? parse_size(*text) : std::nullopt;  // "max" does not parse
    if (!limit || *limit >= kNoLimit) continue;
    found.push_back({*limit, dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"),
                     dir + "/memory.stat", v2 ? "inactive_file" : "total_inactive_file"});
  }
  return found;
}

// The group's headroom; exact up to `enough` (see system_available_memory).
std::optional<size_t> headroom(const Cgroup& group, size_t enough, Buffer& buffer) {
  auto text = read_small(group.usage.c_str(), buffer);
  const auto usage = text ? parse_size(*text) : std::nullopt;
  const auto bound = headroom_of(group.limit, usage, std::nullopt);  // cache counted as used
  if (!bound || *bound > enough) return bound;
  text = read_small(group.stat.c_str(), buffer);
  return headroom_of(group.limit, usage, text ? field(*text, group.inactive_key) : std::nullopt);
}

std::atomic<int64_t> g_override{-1};

}  // namespace

std::optional<size_t> meminfo_available(std::string_view meminfo) {
  auto kb = field(meminfo, "MemAvailable:");
  if (!kb || *kb > SIZE_MAX / 1024) return std::nullopt;
  return *kb * 1024;
}

std::optional<size_t> cgroup_headroom(std::string_view limit, std::string_view usage,
                                      std::string_view stat, std::string_view inactive_key) {
  return headroom_of(parse_size(limit), parse_size(usage), field(stat, inactive_key));
}

std::vector<std::string> cgroup_memory_dirs(std::string_view proc_self_cgroup,
                                            std::string_view v2_mount,
                                            std::string_view v1_mount) {
  std::string_view v2_path, v1_path;
  bool v2 = false, v1 = false;
  for (size_t at = 0; at < proc_self_cgroup.size();) {
    const size_t end = std::min(proc_self_cgroup.find('\n', at), proc_self_cgroup.size());
    std::string_view line = proc_self_cgroup.substr(at, end - at);
    at = end + 1;
    const size_t c1 = line.find(':');
    const size_t c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    std::string_view id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string_view path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {
      v2 = true;
      v2_path = path;
    } else {
      for (size_t s = 0; s <= controllers.size();) {  // "memory" among "a,b,memory"
        const size_t e = std::min(controllers.find(',', s), controllers.size());
        if (controllers.substr(s, e - s) == "memory") {
          v1 = true;
          v1_path = path;
        }
        s = e + 1;
      }
    }
  }
  // A v1 memory controller wins: on a hybrid system the v2 tree has none.
  const std::string_view mount = v1 ? v1_mount : v2_mount;
  std::string_view path = v1 ? v1_path : v2_path;
  if (!v1 && !v2) return {};
  std::vector<std::string> dirs;
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  for (;;) {
    dirs.push_back(std::string(mount) + std::string(path));
    if (path.empty()) break;
    path = path.substr(0, path.rfind('/'));
  }
  return dirs;
}

void override_available_memory(std::optional<size_t> bytes) {
  g_override.store(bytes ? static_cast<int64_t>(std::min<size_t>(*bytes, INT64_MAX)) : -1);
}

size_t system_available_memory(size_t enough) {
  if (const int64_t o = g_override.load(); o >= 0) return static_cast<size_t>(o);
  size_t available = SIZE_MAX;
  Buffer buffer;
  if (auto text = read_small("/proc/meminfo", buffer)) {
    if (auto a = meminfo_available(*text)) available = *a;
  }
  // A process does not change its cgroup: the limited groups are found once.
  static const std::vector<Cgroup> cgroups = find_cgroups();
  for (const Cgroup& group : cgroups) {
    if (auto h = headroom(group, enough, buffer)) available = std::min(available, *h);
  }
  return available;
}

}  // namespace torch_fl::hal
