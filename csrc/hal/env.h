#pragma once

// Strict parsers for the environment variables the HAL reads. Each returns the
// default when the variable is unset and throws hal::ConfigError naming the
// variable, the bad value and what is accepted otherwise (empty counts as bad:
// `FLAGOS_HOST_DEVICES=` is a mistake, not a request for the default).

#include <cstddef>
#include <optional>
#include <string>

namespace torch_fl::hal {

// The raw value, or nullopt when unset.
std::optional<std::string> env_value(const char* name);

// A whole number in [min_value, max_value].
long env_int(const char* name, long default_value, long min_value,
             long max_value);

// Parses a byte size: "123", "64KiB", "2GiB", "1.5GB", "512M" (K/M/G/T with or
// without "B"/"iB"; K=1024 and KB=1000 as SI says, KiB=1024). nullopt when
// the text is not a size. Zero and negative sizes are rejected.
std::optional<size_t> parse_byte_size(const std::string& text);

// FLAGOS_HOST_MEMORY_LIMIT-style variable; nullopt when unset.
std::optional<size_t> env_byte_size(const char* name);

}  // namespace torch_fl::hal
