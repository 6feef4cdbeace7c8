#include "flaggems/kernel_table.h"

#include <c10/util/Exception.h>

#include "aten/provider_error.h"

namespace torch_fl::flaggems {

void* Kernel::function_for(int device, const char* op) {
  FLAGOS_PROVIDER_CHECK(device >= 0 && device < static_cast<int>(function.size()),
                        "flagos: device ", device, " out of range");
  void* f = function[device].load(std::memory_order_acquire);
  if (f) return f;
  std::lock_guard<std::mutex> lock(load_mu);
  f = function[device].load(std::memory_order_acquire);
  if (f) return f;
  cuda::Loaded loaded;
  std::string error;
  if (!cuda::load(device, binary.cubin, binary.name, binary.shared, binary.num_warps, sizes, count,
                  &loaded, &error)) {
    FLAGOS_PROVIDER_CHECK(false, "flagos: cannot load FlagGems kernel ", binary.name, " for ", op,
                          " on device ", device, ": ", error);
  }
  function[device].store(loaded.function, std::memory_order_release);
  return loaded.function;
}

Kernel* KernelTable::find(const abi::Key& key) const noexcept {
  for (size_t probe = 0; probe < kCapacity; ++probe) {
    Kernel* k = slots_[(key.hash + probe) & (kCapacity - 1)].load(std::memory_order_acquire);
    if (!k) return nullptr;
    if (k->key == key) return k;
  }
  return nullptr;
}

Kernel* KernelTable::insert(const abi::Key& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Kernel* k = find(key)) return k;
  if (size_.load() >= kCapacity / 2) return nullptr;  // keep probes short
  for (size_t probe = 0; probe < kCapacity; ++probe) {
    auto& slot = slots_[(key.hash + probe) & (kCapacity - 1)];
    if (slot.load() != nullptr) continue;
    auto* k = new Kernel();  // leaked: launched lock-free until exit
    k->key = key;
    slot.store(k, std::memory_order_release);
    size_.fetch_add(1);
    return k;
  }
  return nullptr;
}

KernelTable& kernels() {
  static auto* t = new KernelTable();  // leaked: read by kernels until exit
  return *t;
}

}  // namespace torch_fl::flaggems
