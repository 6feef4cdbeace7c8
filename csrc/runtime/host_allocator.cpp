#include "runtime/host_allocator.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

namespace torch_fl::runtime {
namespace {

constexpr size_t kAlignment = 64;

struct Registry {
  std::mutex mu;
  std::map<const char*, size_t> blocks;  // base -> size
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: frees run until exit
  return *r;
}

void free_pinned(void* ptr) {
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    r.blocks.erase(static_cast<const char*>(ptr));
  }
  std::free(ptr);
}

class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, c10::Device(c10::DeviceType::CPU));
    size_t rounded = (n + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr,
                     "out of pinned host memory: tried to allocate ", n, " bytes");
    {
      auto& r = registry();
      std::lock_guard<std::mutex> lock(r.mu);
      r.blocks.emplace(static_cast<const char*>(p), n);
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

}  // namespace

c10::Allocator* pinned_host_allocator() {
  static auto* a = new PinnedHostAllocator();
  return a;
}

bool is_pinned_ptr(const void* ptr) {
  auto* p = static_cast<const char*>(ptr);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.blocks.upper_bound(p);
  if (it == r.blocks.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace torch_fl::runtime
