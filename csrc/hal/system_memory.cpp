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

// The text up to the first `sep` (all of it when there is none); `rest`
// moves past that separator.
std::string_view next_piece(std::string_view& rest, char sep) {
  const size_t at = std::min(rest.find(sep), rest.size());
  const std::string_view piece = rest.substr(0, at);
  rest.remove_prefix(std::min(at + 1, rest.size()));
  return piece;
}

// The value after `key` at the start of a line of `text` ("key value").
std::optional<size_t> field(std::string_view text, std::string_view key) {
  while (!text.empty()) {
    const std::string_view line = next_piece(text, '\n');
    if (line.size() > key.size() && line.substr(0, key.size()) == key &&
        (line[key.size()] == ' ' || line[key.size()] == '\t')) {
      return parse_size(line.substr(key.size()));
    }
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
  // The directories are strings of their own: reading the limits below may
  // reuse `buffer`, which `self` points into.
  for (const std::string& dir :
       cgroup_memory_dirs(*self, "/sys/fs/cgroup", "/sys/fs/cgroup/memory")) {
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
  std::optional<std::string_view> v2_path, v1_path;
  while (!proc_self_cgroup.empty()) {  // "id:controllers:path" lines
    std::string_view line = next_piece(proc_self_cgroup, '\n');
    if (std::count(line.begin(), line.end(), ':') < 2) continue;
    const std::string_view id = next_piece(line, ':');
    std::string_view controllers = next_piece(line, ':');
    if (id == "0" && controllers.empty()) v2_path = line;
    while (!controllers.empty()) {  // "memory" among "a,b,memory"
      if (next_piece(controllers, ',') == "memory") v1_path = line;
    }
  }
  // A v1 memory controller wins: on a hybrid system the v2 tree has none.
  if (!v1_path && !v2_path) return {};
  const std::string_view mount = v1_path ? v1_mount : v2_mount;
  std::string_view path = v1_path ? *v1_path : *v2_path;
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
