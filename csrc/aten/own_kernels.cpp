#include "aten/own_kernels.h"

#include <string>
#include <unordered_set>

namespace torch_fl::aten {
namespace {

// Filled at library load, by static registration on one thread, and only read
// afterwards.
std::unordered_set<c10::OperatorName>& own_kernels() {
  static auto* names = new std::unordered_set<c10::OperatorName>();  // leaked with the process
  return *names;
}

}  // namespace

void note_own_kernel(const char* name) {
  const std::string full(name);
  const size_t dot = full.find('.');
  own_kernels().emplace("aten::" + full.substr(0, dot),
                        dot == std::string::npos ? std::string() : full.substr(dot + 1));
}

bool is_own_kernel(const c10::OperatorName& op) { return own_kernels().count(op) != 0; }

}  // namespace torch_fl::aten
