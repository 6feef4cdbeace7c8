#include "hal/env.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "hal/driver.h"

namespace torch_fl::hal {

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

long env_int(const char* name, long default_value, long min_value,
             long max_value) {
  auto raw = env_value(name);
  if (!raw) return default_value;
  const std::string& s = *raw;
  errno = 0;
  char* end = nullptr;
  long v = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
  bool ok = !s.empty() && errno == 0 && end != nullptr && *end == '\0' &&
            !std::isspace(static_cast<unsigned char>(s[0]));
  if (!ok || v < min_value || v > max_value) {
    std::ostringstream msg;
    msg << name << "='" << s << "' is not valid: expected a whole number from "
        << min_value << " to " << max_value << " (unset means " << default_value
        << ")";
    throw ConfigError(msg.str());
  }
  return v;
}

std::optional<size_t> parse_byte_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return std::nullopt;
  std::string number = text.substr(0, i);
  if (number.find('.') != number.rfind('.')) return std::nullopt;
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));

  double scale = 1;
  if (!unit.empty() && unit != "B") {
    const std::string prefixes = "KMGT";
    auto p = prefixes.find(unit[0]);
    if (p == std::string::npos) return std::nullopt;
    std::string rest = unit.substr(1);
    double base;
    if (rest.empty() || rest == "IB") {
      base = 1024;  // "2G" means GiB, as in most memory tools
    } else if (rest == "B") {
      base = 1000;
    } else {
      return std::nullopt;
    }
    scale = std::pow(base, static_cast<double>(p + 1));
  }
  char* end = nullptr;
  double v = std::strtod(number.c_str(), &end);
  if (end == nullptr || *end != '\0' || !(v > 0)) return std::nullopt;
  double bytes = std::floor(v * scale);
  if (bytes < 1 || bytes >= static_cast<double>(std::numeric_limits<size_t>::max()))
    return std::nullopt;
  return static_cast<size_t>(bytes);
}

std::optional<size_t> env_byte_size(const char* name) {
  auto raw = env_value(name);
  if (!raw) return std::nullopt;
  auto bytes = parse_byte_size(*raw);
  if (!bytes) {
    throw ConfigError(std::string(name) + "='" + *raw +
                      "' is not a memory size: write a positive number with "
                      "an optional unit, e.g. 1048576, 512MiB, 2GiB, 1.5GB "
                      "(K/M/G/T; KiB=1024, KB=1000; unset means no limit)");
  }
  return bytes;
}

}  // namespace torch_fl::hal
