#include "hal/system_memory.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>

namespace torch_fl::hal {
namespace {

std::optional<size_t> parse_size(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  return value;
}

std::optional<std::string> read_file(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::optional<size_t> cgroup_headroom_at(const char* limit_path, const char* usage_path) {
  auto limit = read_file(limit_path);
  auto usage = read_file(usage_path);
  if (!limit || !usage) return std::nullopt;
  return cgroup_headroom(*limit, *usage);
}

}  // namespace

std::optional<size_t> meminfo_available(std::string_view meminfo) {
  constexpr std::string_view kKey = "MemAvailable:";
  const size_t at = meminfo.find(kKey);
  if (at == std::string_view::npos) return std::nullopt;
  auto kb = parse_size(meminfo.substr(at + kKey.size()));
  if (!kb || *kb > SIZE_MAX / 1024) return std::nullopt;
  return *kb * 1024;
}

std::optional<size_t> cgroup_headroom(std::string_view limit, std::string_view usage) {
  auto l = parse_size(limit);  // "max" (no limit) does not parse
  auto u = parse_size(usage);
  if (!l || !u) return std::nullopt;
  return *l > *u ? *l - *u : 0;
}

size_t system_available_memory() {
  size_t available = SIZE_MAX;
  if (auto text = read_file("/proc/meminfo")) {
    if (auto a = meminfo_available(*text)) available = *a;
  }
  // cgroup v2: the process's own group ("0::/path" in /proc/self/cgroup),
  // else the root of the namespace (a container's); then v1, whose "no
  // limit" is a huge number, harmless here.
  std::optional<size_t> cgroup;
  if (auto self = read_file("/proc/self/cgroup")) {
    const size_t at = self->find("0::/");
    if (at != std::string::npos) {
      std::string path = self->substr(at + 3, self->find('\n', at) - at - 3);
      std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
      cgroup = cgroup_headroom_at((dir + "/memory.max").c_str(), (dir + "/memory.current").c_str());
    }
  }
  if (!cgroup) {
    cgroup = cgroup_headroom_at("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current");
  }
  if (!cgroup) {
    cgroup = cgroup_headroom_at("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                "/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  if (cgroup) available = std::min(available, *cgroup);
  return available;
}

}  // namespace torch_fl::hal
