// libFuzzer target for the routing-config parser: any bytes either parse or
// produce located errors; nothing crashes, and every reported line exists.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "routing/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = torch_fl::routing::parse_config(text, "fuzz.conf");
  int lines = 1;
  for (char c : text) lines += (c == '\n');
  for (const auto& e : parsed.errors) {
    if (e.line < 1 || e.line > lines || e.message.empty()) std::abort();
    (void)e.to_string();
  }
  for (const auto& e : parsed.entries) {
    if (e.chain.empty() || e.op.empty() || e.line < 1 || e.line > lines) std::abort();
  }
  return 0;
}
