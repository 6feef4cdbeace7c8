#include "aten/python_provider.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include <c10/util/Exception.h>

#include "aten/op_plan.h"

namespace torch_fl::aten {
namespace {

std::atomic<PythonInvoker> g_invoker{nullptr};

struct Table {
  std::mutex mu;
  std::unordered_map<std::string, int64_t> kernels;  // "add.Tensor" -> id
};

Table& table() {
  static auto* t = new Table();  // leaked: read by kernels until exit
  return *t;
}

}  // namespace

void set_python_invoker(PythonInvoker invoker) { g_invoker.store(invoker); }

bool register_python_kernel(const std::string& op_name, int64_t kernel) {
  const c10::OperatorName opname = aten_operator_name(op_name);
  if (!c10::Dispatcher::singleton().findSchema(opname)) return false;
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.kernels[op_key(opname)] = kernel;
  return true;
}

void clear_python_kernels() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  t.kernels.clear();
}

std::vector<std::string> python_kernel_ops() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<std::string> out;
  for (const auto& [name, id] : t.kernels) out.push_back(name);
  return out;
}

std::optional<int64_t> python_kernel_for(const c10::OperatorHandle& op) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.kernels.find(op_key(op.operator_name()));
  if (it == t.kernels.end()) return std::nullopt;
  return it->second;
}

bool has_python_kernels() {
  if (g_invoker.load() == nullptr) return false;
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return !t.kernels.empty();
}

void invoke_python_kernel(int64_t kernel, const c10::OperatorHandle& op,
                          torch::jit::Stack* stack) {
  PythonInvoker invoker = g_invoker.load();
  TORCH_CHECK(invoker != nullptr && kernel >= 0, "flagos: ",
              op.operator_name(), " is routed to flaggems but no Python kernel "
              "is installed for it");
  invoker(kernel, op, stack);
}

}  // namespace torch_fl::aten
