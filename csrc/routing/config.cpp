#include "routing/config.h"

#include <algorithm>
#include <array>
#include <cstdio>

namespace torch_fl::routing {
namespace {

struct Spelling {
  std::string_view word;
  Backend backend;
};

constexpr std::array<Spelling, 9> kSpellings = {{
    {"flaggems", Backend::kFlagGems},
    {"flagos", Backend::kFlagGems},
    {"flagos_python", Backend::kFlagGems},
    {"flaggems_python", Backend::kFlagGems},
    {"cuda", Backend::kCuda},
    {"cpu", Backend::kCpu},
    {"native", Backend::kNative},
    {"metax", Backend::kMetax},
    {"ascend", Backend::kAscend},
}};

std::string_view trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return s.substr(b, e - b);
}

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '_';
}

// name [. overload] with an optional "ns::" prefix; names are identifiers.
// "*" is the default entry: every operator no other entry names.
bool valid_op_name(std::string_view op) {
  if (op == "*") return true;
  auto ns = op.find("::");
  if (ns != std::string_view::npos) {
    std::string_view space = op.substr(0, ns);
    if (space.empty() || !std::all_of(space.begin(), space.end(), is_name_char))
      return false;
    op = op.substr(ns + 2);
  }
  auto dot = op.find('.');
  std::string_view name = op.substr(0, dot);
  if (name.empty() || !std::all_of(name.begin(), name.end(), is_name_char))
    return false;
  if (dot == std::string_view::npos) return true;
  std::string_view overload = op.substr(dot + 1);
  return !overload.empty() &&
         std::all_of(overload.begin(), overload.end(), is_name_char);
}

std::vector<std::string> spelling_list() {
  std::vector<std::string> out;
  for (const auto& s : kSpellings) out.emplace_back(s.word);
  return out;
}

// Optimal string alignment distance: an adjacent transposition ("cdua" for
// "cuda") counts as one edit, as typing slips usually are.
size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      size_t cost = (a[i - 1] == b[j - 1]) ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[n][m];
}

}  // namespace

bool is_valid_op_name(std::string_view op) { return valid_op_name(op); }

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::kFlagGems: return "flaggems";
    case Backend::kCuda: return "cuda";
    case Backend::kCpu: return "cpu";
    case Backend::kNative: return "native";
    case Backend::kMetax: return "metax";
    case Backend::kAscend: return "ascend";
  }
  return "?";
}

std::optional<Backend> parse_backend(std::string_view word) {
  for (const auto& s : kSpellings) {
    if (s.word == word) return s.backend;
  }
  return std::nullopt;
}

std::string backend_choices() {
  return "flaggems (also written flagos, flagos_python, flaggems_python), "
         "cuda, cpu, native, metax, ascend";
}

std::string printable(std::string_view token) {
  std::string out;
  for (unsigned char c : token.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (token.size() > 80) out += "...";
  return out;
}

std::string ConfigError::to_string() const {
  // Appended piecewise: GCC 12 misreports operator+ chains here (-Wrestrict).
  std::string out = source;
  if (line > 0) {
    out.push_back(':');
    out.append(std::to_string(line));
  }
  out.append(": ");
  out.append(message);
  return out;
}

std::string closest_match(std::string_view word,
                          const std::vector<std::string>& candidates) {
  // No operator or backend name is this long: no plausible misspelling, and
  // the edit distance to thousands of names would cost seconds.
  if (word.size() > 64) return std::string();
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Plausible misspelling: a third of the word, at least one edit, and never
  // the whole word (an empty or one-letter word suggested any short name).
  size_t limit = std::min(std::max<size_t>(1, word.size() / 3), word.size() - (word.empty() ? 0 : 1));
  if (word.empty()) return std::string();
  return best_d <= limit ? best : std::string();
}

std::optional<std::vector<Backend>> parse_chain(std::string_view text,
                                                const std::string& source,
                                                int line, std::string_view op,
                                                std::vector<ConfigError>* errors) {
  std::vector<Backend> chain;
  bool ok = true;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string_view word = trim(text.substr(start, comma - start));
    if (word.empty()) {
      errors->push_back({source, line, std::string(text),
                         "empty backend in '" + printable(text) + "' for op '" +
                             std::string(op) + "': write one backend or a "
                             "comma-separated chain of " + backend_choices()});
      ok = false;
    } else if (auto b = parse_backend(word)) {
      if (std::find(chain.begin(), chain.end(), *b) != chain.end()) {
        errors->push_back({source, line, std::string(word),
                           "backend '" + printable(word) + "' appears twice in "
                           "the chain for op '" + std::string(op) + "'"});
        ok = false;
      }
      chain.push_back(*b);
    } else {
      std::string msg = "unknown backend '" + printable(word) + "' for op '" +
                        std::string(op) + "': valid backends are " +
                        backend_choices();
      std::string guess = closest_match(word, spelling_list());
      if (!guess.empty()) msg += ". Did you mean '" + guess + "'?";
      errors->push_back({source, line, std::string(word), msg});
      ok = false;
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (!ok) return std::nullopt;
  return chain;
}

ParsedConfig parse_config(std::string_view text, const std::string& source) {
  ParsedConfig out;
  int line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    std::string_view raw = text.substr(pos, nl == std::string_view::npos
                                                ? std::string_view::npos
                                                : nl - pos);
    ++line_no;
    pos = (nl == std::string_view::npos) ? text.size() + 1 : nl + 1;

    std::string_view line = raw.substr(0, raw.find('#'));
    line = trim(line);
    if (line.empty()) continue;

    auto eq = line.find('=');
    if (eq == std::string_view::npos) {
      out.errors.push_back({source, line_no, std::string(line),
                            "malformed line '" + printable(line) +
                                "': expected 'op = backend' (e.g. 'mm = "
                                "cuda' or 'add.Tensor = flaggems, cuda')"});
      continue;
    }
    std::string_view op = trim(line.substr(0, eq));
    std::string_view rhs = trim(line.substr(eq + 1));
    if (rhs.find('=') != std::string_view::npos) {
      out.errors.push_back({source, line_no, std::string(line),
                            "malformed line '" + printable(line) +
                                "': more than one '='; expected 'op = backend'"});
      continue;
    }
    if (op.empty() || !valid_op_name(op)) {
      out.errors.push_back({source, line_no, std::string(op),
                            "malformed op name '" + printable(op) +
                                "': expected name[.overload] such as 'mm', "
                                "'add.Tensor' or 'aten::mm.out', or '*'"});
      continue;
    }
    std::string name(op);
    if (name.rfind("aten::", 0) == 0) name = name.substr(6);
    auto chain = parse_chain(rhs, source, line_no, name, &out.errors);
    if (!chain) continue;
    auto dup = std::find_if(out.entries.begin(), out.entries.end(),
                            [&](const ConfigEntry& e) { return e.op == name; });
    if (dup != out.entries.end()) {
      out.errors.push_back({source, line_no, name,
                            "op '" + name + "' is routed twice: first at line " +
                                std::to_string(dup->line)});
      continue;
    }
    out.entries.push_back({name, std::move(*chain), source, line_no});
  }
  return out;
}

}  // namespace torch_fl::routing
