#include "routing/table.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include "aten/host_parity.h"
#include "aten/own_kernels.h"
#include "aten/python_provider.h"
#include "aten/shadow_verify.h"
#include "flaggems/cuda_launch.h"
#include "flaggems/launcher.h"
#include "hal/env.h"
#include "runtime/device.h"

extern char** environ;

namespace torch_fl::routing {
namespace {

constexpr const char* kEnvPrefix = "FLAGOS_OP_";
constexpr const char* kDefaultEntry = "*";  // `* = cuda`: every op no entry names

struct Route {
  std::vector<Backend> chain;
  std::string source;  // "env FLAGOS_OP_mm", "file path:3", "api"
};

// Everything load() decides; replaced whole under `mu`.
struct State {
  std::mutex mu;
  std::unordered_map<std::string, Route> api, env, file;  // op name -> route
  std::string config_path;
  std::FILE* log = nullptr;
};

State& state() {
  static auto* s = new State();  // leaked: read by kernels until exit
  return *s;
}

std::atomic<FallbackPolicy> g_policy{FallbackPolicy::kWarn};

// ---- names known to the dispatcher ---------------------------------------
struct OpNames {
  std::unordered_set<std::string> full;  // "add.Tensor", "mm", "ns::op.x"
  std::unordered_set<std::string> base;  // "add", "ns::op"
  std::vector<std::string> all;          // for "did you mean"
  // "add" -> its overloads' operator names (aten ones, for never_routed)
  std::unordered_map<std::string, std::vector<c10::OperatorName>> overloads;
  // "Did you mean" searches left: each compares the name with every operator,
  // and a file of thousands of unknown names would take minutes.
  mutable int suggestions_left = 32;
};

// "aten::add.Tensor" -> "add.Tensor": routes name aten ops without their
// namespace; other namespaces keep it.
std::string without_aten(const std::string& name) {
  return name.rfind("aten::", 0) == 0 ? name.substr(6) : name;
}

std::string short_name(const c10::OperatorName& n) { return without_aten(n.name); }

OpNames collect_op_names() {
  OpNames out;
  for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) {
    std::string base = short_name(n);
    std::string full = aten::op_key(n);
    out.full.insert(full);
    if (out.base.insert(base).second) out.all.push_back(base);
    if (full != base) out.all.push_back(full);
    out.overloads[base].push_back(n);
  }
  return out;
}

bool is_aten(const std::string& op) { return op.find("::") == std::string::npos; }

bool op_exists(const OpNames& names, const std::string& op) {
  // Other namespaces may register after torch_fl loads: they are checked
  // when their operators are first called, not here.
  if (!is_aten(op) || op == kDefaultEntry) return true;
  return names.full.count(op) > 0 || names.base.count(op) > 0;
}

// Why a route for aten name `op` ("linear", "softmax.int", "copy_") would
// change nothing: every overload it names has a composite kernel (implicit or
// explicit), so PyTorch runs the composite for a flagos tensor and only the
// operators it calls reach routing, or a kernel of flagos' own
// (aten/own_kernels.h). Empty where some overload reaches the routing kernel.
std::string never_routed_message(const OpNames& names, const std::string& op) {
  if (!is_aten(op) || op == kDefaultEntry) return {};
  const size_t dot = op.find('.');
  const auto it = names.overloads.find(op.substr(0, dot));
  if (it == names.overloads.end()) return {};
  bool named = false;
  bool own = false;  // an overload served by a kernel of flagos' own
  for (const c10::OperatorName& n : it->second) {
    if (dot != std::string::npos && n.overload_name != op.substr(dot + 1)) continue;
    const auto handle = c10::Dispatcher::singleton().findOp(n);
    if (!handle) continue;
    named = true;
    if (handle->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      if (!aten::is_own_kernel(n)) return {};
      own = true;
      continue;
    }
    const bool composite =
        handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        handle->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        handle->hasKernelForDispatchKey(
            c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
    if (!composite) return {};
  }
  if (!named) return {};
  if (own) {
    return "'" + printable(op) + "' never reaches flagos routing: flagos serves it with a kernel of "
           "its own on every driver (allocation, views, metadata and copies work on the device's "
           "memory directly), so no route applies to it";
  }
  return "'" + printable(op) + "' never reaches flagos routing: PyTorch runs its composite kernel "
         "for every device and routes the operators that kernel calls (linear: addmm or mm; "
         "softmax: _softmax). Route those instead; torch_fl.routing.stats() after a call names "
         "them";
}

std::string unknown_op_message(const OpNames& names, const std::string& op) {
  std::string msg = "unknown operator '" + printable(op) +
                    "': no aten operator or overload has this name";
  if (names.suggestions_left <= 0) return msg;
  --names.suggestions_left;
  std::string guess = closest_match(op, names.all);
  if (!guess.empty()) msg += ". Did you mean '" + guess + "'?";
  return msg;
}

// FLAGOS_OP_add__Tensor -> "add.Tensor". '__' is ambiguous with names that
// contain it (__and__), so every split is tried against the real names.
std::optional<std::string> decode_env_op(const OpNames& names,
                                         const std::string& encoded) {
  if (names.full.count(encoded) || names.base.count(encoded)) return encoded;
  for (size_t pos = encoded.find("__"); pos != std::string::npos;
       pos = encoded.find("__", pos + 1)) {
    std::string candidate =
        encoded.substr(0, pos) + "." + encoded.substr(pos + 2);
    if (names.full.count(candidate)) return candidate;
  }
  return std::nullopt;
}

// ---- availability -----------------------------------------------------------
bool is_host() { return runtime::driver().nativeDevice() == hal::NativeDevice::kHost; }

bool available(Backend b) {
  switch (b) {
    case Backend::kCpu:
    case Backend::kNative:
      return true;
    case Backend::kCuda:
      return !is_host();
    case Backend::kFlagGems:
      // Python kernels (torch_fl.flaggems on the cuda driver; on the host
      // driver only tests register any: a deliberately wrong kernel that
      // verification must catch, tests/python/test_verify.py), or the C++
      // descriptions (cuda driver, or the host's dry run).
      return aten::has_python_kernels() ||
             ((!is_host() || flaggems::cuda::dry_run()) && flaggems::installed());
    case Backend::kMetax:
    case Backend::kAscend:
      return false;
  }
  return false;
}

std::string unavailable_reason(Backend b) {
  switch (b) {
    case Backend::kMetax:
    case Backend::kAscend:
      return "the " + std::string(backend_name(b)) +
             " driver is not built into this installation";
    case Backend::kFlagGems:
      return "the flaggems provider is not registered (it needs the cuda "
             "driver and an importable flag_gems; with FLAGOS_DISABLE_FLAGGEMS_PY=1, "
             "only the operators with a C++ launch description)";
    default:
      return "the '" + std::string(runtime::driver().name()) +
             "' driver does not provide it";
  }
}

std::string available_list() {
  std::string s;
  for (Backend b : available_backends()) {
    if (!s.empty()) s += ", ";
    s += backend_name(b);
  }
  return s;
}

}  // namespace

bool serves(Backend b, const c10::OperatorHandle& op) {
  if (!available(b)) return false;
  switch (b) {
    case Backend::kCpu:
      return op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
    case Backend::kNative:
    case Backend::kCuda:
      // The host driver's own kernels (aten/host_parity.h) serve operators
      // the CPU has none for, such as SyncBatchNorm's.
      if (is_host() && aten::host_parity_kernel(op) != nullptr) return true;
      return op.hasKernelForDispatchKey(is_host() ? c10::DispatchKey::CPU
                                                  : c10::DispatchKey::CUDA);
    case Backend::kFlagGems:
      return aten::python_kernel_for(op).has_value() || flaggems::describe(op) != nullptr;
    default:
      return false;
  }
}

namespace {

// Problems of one chain on this driver, or "" when some backend is usable.
std::string chain_problem(const std::vector<Backend>& chain) {
  for (Backend b : chain) {
    if (available(b)) return "";
  }
  std::string msg = "no backend in the chain is available here: ";
  for (size_t i = 0; i < chain.size(); ++i) {
    if (i) msg += "; ";
    msg += std::string(backend_name(chain[i])) + ": " + unavailable_reason(chain[i]);
  }
  return msg + ". Available on this driver: " + available_list();
}

std::string chain_text(const std::vector<Backend>& chain) {
  std::string s;
  for (Backend b : chain) {
    if (!s.empty()) s += ", ";
    s += backend_name(b);
  }
  return s;
}

bool parse_flag(const char* name, bool dflt, std::vector<std::string>* problems) {
  auto v = hal::env_value(name);
  if (!v) return dflt;
  if (*v == "1") return true;
  if (*v == "0") return false;
  problems->push_back(std::string(name) + "='" + printable(*v) +
                      "' is not valid: use 1 or 0");
  return dflt;
}

std::optional<std::string> read_file(const std::string& path, std::string* error) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    *error = "cannot read config file '" + path + "': no such file";
    return std::nullopt;
  }
  if (path == "/dev/null") return std::string();  // the usual "no configuration"
  if (!std::filesystem::is_regular_file(path, ec)) {
    // A directory, FIFO or device would read as empty, block or never end.
    *error = "cannot read config file '" + path + "': not a regular file";
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::string text;
  if (in) {
    // istream::read turns a failed read(2) into badbit on `in`; `ss <<
    // in.rdbuf()` put it on the string stream instead, and a file that opens
    // but cannot be read (EIO, a write-only file) passed as an empty config.
    char buf[1 << 16];
    while (in.read(buf, sizeof buf), in.gcount() > 0) text.append(buf, in.gcount());
  }
  if (!in.is_open() || in.bad()) {
    *error = "cannot read config file '" + path + "': not readable";
    return std::nullopt;
  }
  return text;
}

// Checks a parsed file; valid entries go to *routes. Problems come out in
// line order, grammar and semantic ones interleaved.
void check_entries(const ParsedConfig& parsed, const OpNames& names,
                   std::unordered_map<std::string, Route>* routes,
                   std::vector<std::string>* problems) {
  std::vector<std::pair<int, std::string>> found;
  for (const auto& e : parsed.errors) found.emplace_back(e.line, e.to_string());
  for (const auto& e : parsed.entries) {
    std::string where = e.source + ":" + std::to_string(e.line);
    if (!op_exists(names, e.op)) {
      found.emplace_back(e.line, where + ": " + unknown_op_message(names, e.op));
      continue;
    }
    if (std::string why = never_routed_message(names, e.op); !why.empty()) {
      found.emplace_back(e.line, where + ": " + why);
      continue;
    }
    std::string bad = chain_problem(e.chain);
    if (!bad.empty()) {
      found.emplace_back(e.line, where + ": route '" + e.op + " = " +
                                     chain_text(e.chain) + "': " + bad);
    }
    // Installed even when no backend is available here: with
    // FLAGOS_CONFIG_STRICT=0 the op then runs as a counted CPU fallback.
    if (routes) (*routes)[e.op] = Route{e.chain, "file " + where};
  }
  std::stable_sort(found.begin(), found.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& f : found) problems->push_back(std::move(f.second));
}

const Route* lookup(const std::unordered_map<std::string, Route>& m,
                    const std::string& full, const std::string& base) {
  auto it = m.find(full);
  if (it != m.end()) return &it->second;
  if (full != base) {
    it = m.find(base);
    if (it != m.end()) return &it->second;
  }
  return nullptr;
}

// The route configured for an operator ("aten::add.Tensor"), by precedence
// api > env > file and, within each, overload > base; an entry naming the
// operator in any source wins over every `*` entry, which follow the same
// source order. Caller holds s.mu.
const Route* find_route(const State& s, const std::string& plan_name) {
  std::string full = without_aten(plan_name);
  std::string base = full.substr(0, full.find('.'));
  for (const auto* m : {&s.api, &s.env, &s.file}) {
    if (const Route* r = lookup(*m, full, base)) return r;
  }
  for (const auto* m : {&s.api, &s.env, &s.file}) {
    if (const Route* r = lookup(*m, kDefaultEntry, kDefaultEntry)) return r;
  }
  return nullptr;
}

}  // namespace

namespace detail {
std::atomic<uint32_t> g_epoch{1};
std::atomic<uint32_t> g_every_call{0};
}  // namespace detail

uint32_t set_every_call_bits(uint32_t bits, bool on) noexcept {
  return on ? detail::g_every_call.fetch_or(bits) : detail::g_every_call.fetch_and(~bits);
}
FallbackPolicy fallback_policy() noexcept {
  return g_policy.load(std::memory_order_relaxed);
}

std::vector<Backend> available_backends() {
  std::vector<Backend> out;
  for (int i = 0; i < kNumBackends; ++i) {
    if (available(static_cast<Backend>(i))) out.push_back(static_cast<Backend>(i));
  }
  return out;
}

std::vector<std::string> check_file(const std::string& path) {
  std::vector<std::string> problems;
  std::string error;
  auto text = read_file(path, &error);
  if (!text) return {error};
  OpNames names = collect_op_names();
  check_entries(parse_config(*text, path), names, nullptr, &problems);
  return problems;
}

std::vector<std::string> load(const std::string& default_path) {
  std::vector<std::string> problems;
  OpNames names = collect_op_names();

  // Policies.
  FallbackPolicy policy = FallbackPolicy::kWarn;
  if (auto v = hal::env_value("FLAGOS_CPU_FALLBACK")) {
    if (*v == "warn") policy = FallbackPolicy::kWarn;
    else if (*v == "allow") policy = FallbackPolicy::kAllow;
    else if (*v == "error") policy = FallbackPolicy::kError;
    else
      problems.push_back("FLAGOS_CPU_FALLBACK='" + printable(*v) +
                         "' is not valid: use warn (the default), allow or error");
  }
  bool log = parse_flag("FLAGOS_LOG_DISPATCH", false, &problems);
  aten::VerifyMode verify = aten::VerifyMode::kOff;
  if (auto v = hal::env_value("FLAGOS_VERIFY")) {
    if (*v == "0") verify = aten::VerifyMode::kOff;
    else if (*v == "1") verify = aten::VerifyMode::kReport;
    else if (*v == "error") verify = aten::VerifyMode::kError;
    else
      problems.push_back("FLAGOS_VERIFY='" + printable(*v) +
                         "' is not valid: use 1 (compare every routed call with the reference "
                         "backend and report divergences at exit), error (raise at the first "
                         "divergence) or 0 (off, the default)");
  }
  // Written by the Python layer at exit (torch_fl.tuning, torch_fl.report):
  // checked here so that a bad path is reported with the rest, at import.
  if (auto dir = hal::env_value("FLAGOS_TUNE")) {
    std::error_code ec;
    if (dir->empty() || !std::filesystem::is_directory(*dir, ec))
      problems.push_back("FLAGOS_TUNE='" + printable(*dir) +
                         "' is not a directory: name an existing directory for the tuning "
                         "data (python -m torch_fl tune sets it)");
  }
  if (auto path = hal::env_value("FLAGOS_REPORT")) {
    std::error_code ec;
    std::filesystem::path p(*path);
    std::filesystem::path parent = p.parent_path().empty() ? "." : p.parent_path();
    if (path->empty() || !std::filesystem::is_directory(parent, ec) ||
        std::filesystem::is_directory(p, ec))
      problems.push_back("FLAGOS_REPORT='" + printable(*path) +
                         "' cannot be written: name a file (e.g. run.json) in an existing "
                         "directory");
  }
  // Stub-only mode (spec): no Python-registered provider; checked here so a
  // bad value is reported with the rest. The flaggems provider reads it.
  parse_flag("FLAGOS_DISABLE_FLAGGEMS_PY", false, &problems);
  std::FILE* log_file = nullptr;
  if (auto path = hal::env_value("FLAGOS_LOG_FILE"); path && log) {
    log_file = std::fopen(path->c_str(), "a");
    if (!log_file) {
      problems.push_back("FLAGOS_LOG_FILE='" + printable(*path) +
                         "' cannot be opened for appending");
    }
  }

  // The file.
  std::unordered_map<std::string, Route> file_routes;
  std::string path = hal::env_value("FLAGOS_BACKEND_CONFIG").value_or(default_path);
  if (auto explicit_path = hal::env_value("FLAGOS_BACKEND_CONFIG");
      explicit_path && explicit_path->empty()) {
    problems.push_back("FLAGOS_BACKEND_CONFIG is set but empty: name a config "
                       "file, or unset it to use the packaged backends.conf");
    path = default_path;
  }
  if (!path.empty()) {
    std::string error;
    if (auto text = read_file(path, &error)) {
      check_entries(parse_config(*text, path), names, &file_routes, &problems);
    } else {
      problems.push_back("FLAGOS_BACKEND_CONFIG: " + error);
      path.clear();
    }
  }

  // FLAGOS_OP_* overrides.
  std::unordered_map<std::string, Route> env_routes;
  std::vector<std::string> env_vars;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    if (kv.rfind(kEnvPrefix, 0) == 0) env_vars.push_back(kv);
  }
  std::sort(env_vars.begin(), env_vars.end());
  for (const auto& kv : env_vars) {
    auto eq = kv.find('=');
    std::string var = kv.substr(0, eq);
    std::string value = kv.substr(eq + 1);
    std::string encoded = var.substr(std::char_traits<char>::length(kEnvPrefix));
    auto op = decode_env_op(names, encoded);
    if (!op) {
      std::string msg = var + " names no operator: '" + printable(encoded) +
                        "' is not an aten operator or overload (write '.' as "
                        "'__', e.g. FLAGOS_OP_add__Tensor)";
      // Compared as variable names: "add__tensor" is add.Tensor misspelt, not add_.Tensor.
      std::vector<std::string> encoded_names;
      encoded_names.reserve(names.all.size());
      for (const auto& n : names.all) encoded_names.push_back(env_var(n).substr(std::strlen(kEnvPrefix)));
      std::string guess = closest_match(encoded, encoded_names);
      if (!guess.empty()) msg += ". Did you mean " + std::string(kEnvPrefix) + guess + "?";
      problems.push_back(msg);
      continue;
    }
    if (std::string why = never_routed_message(names, *op); !why.empty()) {
      problems.push_back(var + ": " + why);
      continue;
    }
    std::vector<ConfigError> errors;
    auto chain = parse_chain(value, var, 0, *op, &errors);
    for (const auto& err : errors) problems.push_back(err.to_string());
    if (!chain) continue;
    std::string bad = chain_problem(*chain);
    if (!bad.empty()) problems.push_back(var + "='" + printable(value) + "': " + bad);
    if (auto seen = env_routes.find(*op); seen != env_routes.end()) {
      // FLAGOS_OP_add__Tensor and a spelling of the same operator by another name
      problems.push_back(var + ": '" + *op + "' is routed twice, also by " +
                         seen->second.source.substr(4) + "; keep one");
      continue;
    }
    env_routes[*op] = Route{*chain, "env " + var};  // see check_entries
  }

  {
    auto& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.file = std::move(file_routes);
    s.env = std::move(env_routes);
    s.config_path = path;
    if (s.log && s.log != stderr) std::fclose(s.log);
    s.log = log_file ? log_file : stderr;
  }
  g_policy.store(policy);
  aten::set_env_verify_mode(verify);
  set_every_call_bits(kLogBit, log);
  detail::g_epoch.fetch_add(1);
  return problems;
}

namespace {

// The backend `route` (null: none configured) gives `op`: the first of its
// chain that can run it; none where no backend can (a CPU fallback).
std::optional<Backend> choose(const c10::OperatorHandle& op, const Route* route) {
  if (!route) return serves(Backend::kFlagGems, op) ? Backend::kFlagGems : Backend::kNative;
  for (Backend b : route->chain) {
    if (serves(b, op)) return b;
  }
  return std::nullopt;
}

}  // namespace

void resolve(const c10::OperatorHandle& op, aten::OpPlan& plan) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  uint32_t now = detail::g_epoch.load();
  if (plan.route_epoch.load() == now) return;  // another thread did it

  const Route* route = find_route(s, plan.name);
  const std::optional<Backend> chosen = choose(op, route);
  bool fallback = !chosen.has_value();
  if (fallback && fallback_policy() == FallbackPolicy::kWarn) {
    TORCH_WARN("flagos: ", plan.name, " is routed to [",
               chain_text(route->chain), "] (", route->source,
               ") but none of them can run it on the '", runtime::driver().name(),
               "' driver, so it runs on the CPU. Set FLAGOS_CPU_FALLBACK=allow "
               "to silence this or =error to forbid it.");
  }
  if (chosen == Backend::kFlagGems) {
    plan.python_kernel.store(aten::python_kernel_for(op).value_or(-1));
  }
  plan.flaggems_op.store(chosen == Backend::kFlagGems ? flaggems::describe(op) : nullptr);
  plan.backend.store(chosen.value_or(Backend::kCpu));
  plan.cpu_fallback.store(fallback);
  const Backend b = chosen.value_or(Backend::kCpu);
  plan.native_route.store(!fallback && (b == Backend::kNative || b == Backend::kCuda ||
                                        (b == Backend::kCpu && is_host())));
  plan.route_epoch.store(now, std::memory_order_release);
}

std::string env_var(std::string_view op) {
  std::string var = kEnvPrefix;
  for (char c : op) {
    if (c == '.') {
      var += "__";
    } else {
      var += c;
    }
  }
  return var;
}

void set_route(const std::string& op_text, const std::string& chain_text_in) {
  OpNames names = collect_op_names();
  std::string op = without_aten(op_text);
  TORCH_CHECK_VALUE(is_valid_op_name(op_text), "set_route: malformed op name '", op_text,
                    "': expected name[.overload] such as 'mm', 'add.Tensor' or 'aten::mm.out', "
                    "or '*' (the grammar of a backends.conf line)");
  TORCH_CHECK_VALUE(op_exists(names, op), "set_route: ", unknown_op_message(names, op));
  if (!chain_text_in.empty()) {
    const std::string why = never_routed_message(names, op);
    TORCH_CHECK_VALUE(why.empty(), "set_route: ", why);
  }
  auto& s = state();
  if (chain_text_in.empty()) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.api.erase(op);
  } else {
    std::vector<ConfigError> errors;
    auto chain = parse_chain(chain_text_in, "set_route", 0, op, &errors);
    TORCH_CHECK_VALUE(chain.has_value(), "set_route: ", errors.front().message);
    std::string bad = chain_problem(*chain);
    TORCH_CHECK_VALUE(bad.empty(), "set_route('", op, "', '", chain_text_in, "'): ", bad);
    std::lock_guard<std::mutex> lock(s.mu);
    s.api[op] = Route{*chain, "api"};
  }
  detail::g_epoch.fetch_add(1);
}

std::vector<Row> table() {
  std::vector<Row> rows;
  std::unordered_set<std::string> seen;
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint32_t now = detail::g_epoch.load();
  aten::for_each_plan([&](aten::OpPlan& plan) {
    if (plan.route_epoch.load() == 0) return;
    const Route* r = find_route(s, plan.name);
    Backend b = plan.backend.load();
    bool fallback = plan.cpu_fallback.load();
    const void* flaggems_op = plan.flaggems_op.load();
    if (plan.route_epoch.load() != now) {
      // The configuration changed since the operator's last call: the row
      // shows what its next call takes, as resolve will choose it.
      const size_t ns = plan.name.find("::");
      const size_t dot = plan.name.find('.', ns == std::string::npos ? 0 : ns + 2);
      const c10::OperatorName name(plan.name.substr(0, dot),
                                   dot == std::string::npos ? "" : plan.name.substr(dot + 1));
      if (auto op = c10::Dispatcher::singleton().findOp(name)) {
        const std::optional<Backend> chosen = choose(*op, r);
        b = chosen.value_or(Backend::kCpu);
        fallback = !chosen.has_value();
        flaggems_op = b == Backend::kFlagGems ? flaggems::describe(*op) : nullptr;
      }
    }
    std::string via;
    if (b == Backend::kFlagGems) {
      via = flaggems_op != nullptr && flaggems::cpp_enabled() ? "c++" : "python";
    }
    rows.push_back({plan.name, std::string(backend_name(b)), r ? r->source : "default", true,
                    fallback, via});
    seen.insert(without_aten(plan.name));
  });
  for (auto* m : {&s.api, &s.env, &s.file}) {
    for (const auto& [op, route] : *m) {
      if (seen.insert(op).second)
        rows.push_back({op, chain_text(route.chain), route.source, false, false, ""});
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.op < b.op; });
  return rows;
}

std::vector<Stat> stats() {
  std::vector<Stat> out;
  aten::for_each_plan([&](aten::OpPlan& plan) {
    Stat st{plan.name, {}, plan.fallback_calls.load()};
    for (int i = 0; i < kNumBackends; ++i) {
      uint64_t n = plan.calls[i].load();
      if (n == 0) continue;
      if (static_cast<Backend>(i) == Backend::kFlagGems) {
        // Launched from C++ ("flaggems") or through FlagGems' Python wrapper.
        const uint64_t cpp = std::min(n, plan.flaggems_cpp_calls.load());
        if (cpp) st.calls.emplace_back(std::string(backend_name(Backend::kFlagGems)), cpp);
        if (n - cpp) st.calls.emplace_back(kFlagGemsPython, n - cpp);
        continue;
      }
      st.calls.emplace_back(std::string(backend_name(static_cast<Backend>(i))), n);
    }
    if (!st.calls.empty() || st.cpu_fallbacks) out.push_back(std::move(st));
  });
  std::sort(out.begin(), out.end(), [](const Stat& a, const Stat& b) { return a.op < b.op; });
  return out;
}

void reset_stats() {
  aten::for_each_plan([](aten::OpPlan& plan) {
    for (auto& c : plan.calls) c.store(0);
    plan.fallback_calls.store(0);
    plan.flaggems_cpp_calls.store(0);
  });
}

void log_dispatch(const aten::OpPlan& plan, Backend backend) {
  auto& s = state();
  std::string source = "default";
  std::lock_guard<std::mutex> lock(s.mu);
  if (const Route* r = find_route(s, plan.name)) source = r->source;
  std::fprintf(s.log ? s.log : stderr, "[flagos dispatch] %s -> %s (%s%s)\n",
               plan.name.c_str(), std::string(backend_name(backend)).c_str(),
               source.c_str(), plan.cpu_fallback.load() ? ", cpu fallback" : "");
  std::fflush(s.log ? s.log : stderr);
}

std::string config_path() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.config_path;
}

}  // namespace torch_fl::routing
