#include "flaggems/registry.h"

#include <cstring>
#include <deque>
#include <memory>
#include <unordered_set>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

namespace torch_fl::flaggems {
namespace {

std::atomic<PythonSide*> g_side{nullptr};

struct Functions {
  std::mutex mu;
  std::deque<JitFn> fns;  // stable addresses
  std::array<std::atomic<const JitFn*>, 4096> by_id{};
  std::unordered_set<std::string> warned;
  std::string triton_version;
};

Functions& functions() {
  static auto* f = new Functions();  // leaked: read by kernels until exit
  return *f;
}

// Registers an export under its Python id; the same id returns the same JitFn.
const JitFn* add_fn(const std::string& ref, ExportedFn&& e) {
  auto& f = functions();
  TORCH_CHECK(e.id >= 0 && e.id < static_cast<int>(f.by_id.size()),
              "flagos: FlagGems function id ", e.id, " out of range");
  std::lock_guard<std::mutex> lock(f.mu);
  if (const JitFn* known = f.by_id[e.id].load()) return known;
  JitFn& fn = f.fns.emplace_back();
  fn.id = static_cast<uint16_t>(e.id);
  fn.ref = ref;
  fn.cache_key = std::move(e.cache_key);
  fn.names = std::move(e.names);
  fn.params = std::move(e.params);
  f.by_id[e.id].store(&fn, std::memory_order_release);
  return &fn;
}

bool names_match(const JitFn& fn, const std::vector<const char*>& want, std::string* why) {
  if (fn.names.size() != want.size()) {
    *why = "has " + std::to_string(fn.names.size()) + " parameters, the planner expects " +
           std::to_string(want.size());
    return false;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    if (fn.names[i] != want[i]) {
      *why = "parameter " + std::to_string(i) + " is '" + fn.names[i] + "', the planner expects '" +
             want[i] + "'";
      return false;
    }
  }
  return true;
}

}  // namespace

void set_python_side(PythonSide* side) { g_side.store(side); }
PythonSide* python_side() { return g_side.load(); }

const JitFn* jit_fn(int id) noexcept {
  auto& f = functions();
  if (id < 0 || id >= static_cast<int>(f.by_id.size())) return nullptr;
  return f.by_id[id].load(std::memory_order_acquire);
}

void warn_once(const std::string& key, const std::string& message) {
  auto& f = functions();
  {
    std::lock_guard<std::mutex> lock(f.mu);
    if (!f.warned.insert(key).second) return;
  }
  TORCH_WARN("flagos: ", message);
}

void set_triton_version(std::string v) {
  auto& f = functions();
  std::lock_guard<std::mutex> lock(f.mu);
  f.triton_version = std::move(v);
}

const std::string& triton_version() { return functions().triton_version; }

namespace {

constexpr const char* kOnPython = "; its operators run through FlagGems' Python wrappers";

// One export: unless `state` says it was tried already, asks the Python side
// through `attempt`, which stores what it exported and returns "", or returns
// what failed (warned once, after "FlagGems' <ref> ").
template <typename Attempt>
bool resolve_once(std::atomic<SlotState>& state, const std::string& ref, Attempt&& attempt) {
  const SlotState s = state.load(std::memory_order_acquire);
  if (s != SlotState::kUnresolved) return s == SlotState::kReady;
  PythonSide* side = python_side();
  if (!side) return false;
  const std::string failure = attempt(*side);
  if (!failure.empty()) {
    warn_once("export:" + ref, "FlagGems' " + ref + " " + failure);
    state.store(SlotState::kFailed);
    return false;
  }
  state.store(SlotState::kReady, std::memory_order_release);
  return true;
}

}  // namespace

bool resolve(KernelSlot& slot) {
  const std::string ref = std::string(slot.module) + ":" + slot.qualname;
  return resolve_once(slot.state, ref, [&](PythonSide& side) -> std::string {
    ExportedFn e = side.export_fn(ref);
    if (e.id < 0) return "cannot be launched from C++ (" + e.error + ")" + kOnPython;
    const JitFn* fn = add_fn(ref, std::move(e));
    std::string why;
    if (!names_match(*fn, slot.names, &why)) {
      return why + " (another FlagGems version?)" + kOnPython;
    }
    slot.fn.store(fn, std::memory_order_release);
    return "";
  });
}

bool resolve(PointwiseSlot& slot) {
  const std::string ref = std::string(slot.module) + ":" + slot.name;
  return resolve_once(slot.state, ref, [&](PythonSide& side) -> std::string {
    auto info = std::make_unique<PointwiseInfo>(side.pointwise(ref));
    if (!info->error.empty()) {
      return "cannot be launched from C++ (" + info->error + ")" + kOnPython;
    }
    slot.info.store(info.release(), std::memory_order_release);  // leaked with the slot
    return "";
  });
}

bool resolve_rank(PointwiseSlot& slot, int rank) {
  if (rank == 0) return resolve(slot);  // the function's layout, before any rank
  if (rank < 1 || rank > kMaxPointwiseRank || !resolve(slot)) return false;
  const std::string ref = std::string(slot.module) + ":" + slot.name + "@" + std::to_string(rank);
  return resolve_once(slot.rank_state[rank], ref, [&](PythonSide& side) -> std::string {
    ExportedFn e = side.export_fn(ref);
    if (e.id < 0) return "cannot be launched from C++ (" + e.error + ")";
    slot.rank_fn[rank].store(add_fn(ref, std::move(e)), std::memory_order_release);
    return "";
  });
}

// ---- TunerTable ------------------------------------------------------------

namespace {
uint64_t tuner_hash(const int64_t* key, int n) {
  return abi::hash_bytes(key, sizeof(int64_t) * static_cast<size_t>(n));
}
}  // namespace

const TunedConfig* TunerTable::find(const int64_t* key, int n) const noexcept {
  const uint64_t h = tuner_hash(key, n);
  for (int probe = 0; probe < kCapacity; ++probe) {
    const Entry* e = slots_[(h + probe) % kCapacity].load(std::memory_order_acquire);
    if (!e) return nullptr;
    if (e->n == n && std::memcmp(e->key, key, sizeof(int64_t) * n) == 0) return &e->cfg;
  }
  return nullptr;
}

void TunerTable::insert(const int64_t* key, int n, const TunedConfig& cfg) {
  TORCH_CHECK(n <= kMaxTunerKey, "flagos: tuner key too long");
  std::lock_guard<std::mutex> lock(mu_);
  if (find(key, n)) return;
  const uint64_t h = tuner_hash(key, n);
  for (int probe = 0; probe < kCapacity; ++probe) {
    auto& slot = slots_[(h + probe) % kCapacity];
    if (slot.load() != nullptr) continue;
    auto* e = new Entry();  // leaked: read lock-free until exit
    e->n = n;
    std::memcpy(e->key, key, sizeof(int64_t) * n);
    e->cfg = cfg;
    slot.store(e, std::memory_order_release);
    return;
  }
  warn_once("tuner-full", "the FlagGems tuner table is full; new configurations are not kept");
}

}  // namespace torch_fl::flaggems
