#pragma once

// The routing configuration language (backends.conf and FLAGOS_OP_* values),
// parsed without torch so that it is unit-tested and fuzzed on its own.
//
// Grammar, one entry per line:
//   line    := [ op "=" chain ] [ "#" comment ]
//   op      := [ namespace "::" ] name [ "." overload ]     e.g. mm, add.Tensor, aten::mm.out
//            | "*"                          the default: every operator no entry names
//   chain   := backend { "," backend }                      first available wins
//   backend := flaggems | flagos | flagos_python | flaggems_python   (all one backend)
//            | cuda | cpu | native | metax | ascend
// Whitespace around tokens is ignored; blank lines and comments are skipped.
// Every mistake becomes a ConfigError with its source and line; parsing goes
// on after a mistake so that one run reports all of them.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace torch_fl::routing {

enum class Backend : uint8_t {
  kFlagGems = 0,
  kCuda,
  kCpu,
  kNative,  // the driver's own kernels: cpu on the host driver, cuda on cuda
  kMetax,   // reserved: vendor drivers not built into this installation
  kAscend,
};
constexpr int kNumBackends = 6;

std::string_view backend_name(Backend b);
// Accepts the canonical names and the spec's aliases; nullopt otherwise.
std::optional<Backend> parse_backend(std::string_view word);
// "flaggems (also flagos, flagos_python, flaggems_python), cuda, ..." for errors.
std::string backend_choices();

struct ConfigEntry {
  std::string op;  // normalised: "aten::" dropped, other namespaces kept
  std::vector<Backend> chain;
  std::string source;  // file path or environment variable name
  int line = 0;        // 0 for environment variables
};

struct ConfigError {
  std::string source;
  int line = 0;
  std::string token;    // the offending text, as written
  std::string message;  // what is wrong and what is accepted
  // "source:line: message"
  std::string to_string() const;
};

struct ParsedConfig {
  std::vector<ConfigEntry> entries;
  std::vector<ConfigError> errors;
};

ParsedConfig parse_config(std::string_view text, const std::string& source);

// Parses one chain ("cuda", "flaggems, cuda"), as FLAGOS_OP_* values hold.
// Whether `op` is name[.overload] with an optional "ns::" prefix, or "*":
// the grammar of a config line's left-hand side.
bool is_valid_op_name(std::string_view op);

std::optional<std::vector<Backend>> parse_chain(std::string_view text,
                                                const std::string& source,
                                                int line, std::string_view op,
                                                std::vector<ConfigError>* errors);

// The candidate closest to `word` by edit distance, if it is close enough to
// be a plausible misspelling; empty otherwise.
std::string closest_match(std::string_view word,
                          const std::vector<std::string>& candidates);

// Printable form of a token for messages (control bytes escaped, long tokens
// cut).
std::string printable(std::string_view token);

}  // namespace torch_fl::routing
