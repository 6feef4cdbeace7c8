#include "flaggems/disk_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "hal/env.h"

namespace torch_fl::flaggems::disk {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[] = "torch_fl-flaggems-1\n";

struct State {
  std::once_flag once;
  std::string dir;  // "" = off
};

State& state() {
  static auto* s = new State();
  return *s;
}

std::string default_root() {
  if (auto v = hal::env_value("FLAGOS_CACHE_DIR")) return *v;
  if (auto x = hal::env_value("XDG_CACHE_HOME"); x && !x->empty()) return *x + "/torch_fl";
  if (const char* home = std::getenv("HOME")) return std::string(home) + "/.cache/torch_fl";
  return "";
}

void init() {
  State& s = state();
  std::string root = default_root();
  if (root.empty()) {
    warn_once("disk-cache", "FLAGOS_CACHE_DIR is empty (or HOME unset): the FlagGems kernel "
                            "disk cache is off");
    return;
  }
  std::string dir = root + "/flaggems";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec) || ::access(dir.c_str(), W_OK) != 0) {
    warn_once("disk-cache", "cannot use '" + dir + "' for the FlagGems kernel disk cache (set "
                            "FLAGOS_CACHE_DIR to a writable directory): it is off");
    return;
  }
  s.dir = dir;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string path_for(const std::string& kind, const std::string& identity) {
  const std::string dir = directory();
  if (dir.empty()) return "";
  uint64_t a = abi::hash_bytes(identity.data(), identity.size());
  uint64_t b = abi::hash_bytes(identity.data(), identity.size(), 0x84222325cbf29ce4ULL);
  return dir + "/" + kind + "-" + hex(a) + hex(b);
}

// ---- a tiny length-prefixed format ----
// Fixed-size values in host byte order; strings as a u32 length and the bytes.
template <typename T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof v);
}
void put_u32(std::string& out, uint32_t v) { put(out, v); }
void put_i64(std::string& out, int64_t v) { put(out, v); }
void put_str(std::string& out, const std::string& s) {
  put_u32(out, static_cast<uint32_t>(s.size()));
  out += s;
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  bool ok = true;
  template <typename T>
  T get() {
    T v{};
    if (pos + sizeof v > s.size()) {
      ok = false;
      return T{};
    }
    std::memcpy(&v, s.data() + pos, sizeof v);
    pos += sizeof v;
    return v;
  }
  uint32_t u32() { return get<uint32_t>(); }
  int64_t i64() { return get<int64_t>(); }
  std::string str() {
    uint32_t n = u32();
    if (!ok || pos + n > s.size()) {
      ok = false;
      return "";
    }
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
};

std::optional<std::string> read_entry(const std::string& path, const std::string& identity) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  const size_t magic = sizeof(kMagic) - 1;
  if (data.compare(0, magic, kMagic) != 0) return std::nullopt;
  Reader r{data, magic};
  if (r.str() != identity || !r.ok) return std::nullopt;  // a hash collision or another version
  return data.substr(r.pos);
}

void write_entry(const std::string& path, const std::string& identity, const std::string& body) {
  if (path.empty()) return;
  std::string data(kMagic);
  put_str(data, identity);
  data += body;
  std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!out) {
      std::remove(tmp.c_str());
      return;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) std::remove(tmp.c_str());
}

}  // namespace

std::string directory() {
  State& s = state();
  std::call_once(s.once, init);
  return s.dir;
}

std::string kernel_identity(const JitFn& fn, int arch, const abi::Key& key) {
  std::string id = "kernel|triton " + triton_version() + "|sm" + std::to_string(arch) + "|" +
                   fn.ref + "|" + fn.cache_key + "|";
  id.append(reinterpret_cast<const char*>(key.bytes + 2), key.len - 2);  // without the process-local id
  return id;
}

std::string tuner_identity(const JitFn& fn, int arch, const int64_t* key, int n) {
  std::string id = "tuner|triton " + triton_version() + "|sm" + std::to_string(arch) + "|" +
                   fn.ref + "|" + fn.cache_key + "|";
  id.append(reinterpret_cast<const char*>(key), sizeof(int64_t) * static_cast<size_t>(n));
  return id;
}

std::optional<KernelEntry> load_kernel(const std::string& identity) {
  auto body = read_entry(path_for("k", identity), identity);
  if (!body) return std::nullopt;
  Reader r{*body};
  KernelEntry e;
  e.verified = r.u32() != 0;
  KernelBinary& b = e.binary;
  b.shared = r.u32();
  b.num_warps = static_cast<int>(r.u32());
  b.num_stages = static_cast<int>(r.u32());
  b.num_ctas = static_cast<int>(r.u32());
  b.global_scratch = r.i64();
  b.profile_scratch = r.i64();
  uint32_t flags = r.u32();
  b.cooperative = flags & 1;
  b.pdl = flags & 2;
  b.tensor_descriptors = flags & 4;
  b.name = r.str();
  b.hash = r.str();
  b.cubin = r.str();
  if (!r.ok || b.cubin.empty()) return std::nullopt;
  return e;
}

void store_kernel(const std::string& identity, const KernelEntry& e) {
  std::string body;
  const KernelBinary& b = e.binary;
  put_u32(body, e.verified ? 1 : 0);
  put_u32(body, b.shared);
  put_u32(body, static_cast<uint32_t>(b.num_warps));
  put_u32(body, static_cast<uint32_t>(b.num_stages));
  put_u32(body, static_cast<uint32_t>(b.num_ctas));
  put_i64(body, b.global_scratch);
  put_i64(body, b.profile_scratch);
  put_u32(body, (b.cooperative ? 1 : 0) | (b.pdl ? 2 : 0) | (b.tensor_descriptors ? 4 : 0));
  put_str(body, b.name);
  put_str(body, b.hash);
  put_str(body, b.cubin);
  write_entry(path_for("k", identity), identity, body);
}

std::optional<TunedConfig> load_tuned(const std::string& identity) {
  auto body = read_entry(path_for("t", identity), identity);
  if (!body) return std::nullopt;
  Reader r{*body};
  TunedConfig c;
  for (auto& v : c.values) v = r.i64();
  c.num_warps = static_cast<uint8_t>(r.u32());
  c.num_stages = static_cast<uint8_t>(r.u32());
  if (!r.ok) return std::nullopt;
  return c;
}

void store_tuned(const std::string& identity, const TunedConfig& c) {
  std::string body;
  for (auto v : c.values) put_i64(body, v);
  put_u32(body, c.num_warps);
  put_u32(body, c.num_stages);
  write_entry(path_for("t", identity), identity, body);
}

}  // namespace torch_fl::flaggems::disk
