#include "runtime/host_allocator.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include "runtime/version.h"

#if FLAGOS_HAS_HOST_ALLOCATOR
#include <ATen/core/CachingHostAllocator.h>
#endif

namespace torch_fl::runtime {
namespace {

constexpr size_t kAlignment = 64;

struct Registry {
  std::mutex mu;
  std::map<const char*, size_t> blocks;  // base -> size
#if FLAGOS_HAS_HOST_ALLOCATOR
  at::HostStats stats;  // what torch.accelerator's host-memory statistics read
#endif
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: frees run until exit
  return *r;
}

void free_pinned(void* ptr) {
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.blocks.find(static_cast<const char*>(ptr));
    if (it != r.blocks.end()) {
#if FLAGOS_HAS_HOST_ALLOCATOR
      r.stats.active_requests.decrease(1);
      r.stats.active_bytes.decrease(it->second);
      r.stats.allocations.decrease(1);
      r.stats.allocated_bytes.decrease(it->second);
      ++r.stats.num_host_free;
#endif
      r.blocks.erase(it);
    }
  }
  std::free(ptr);
}

// Registered as PrivateUse1's host allocator where torch has the interface
// (torch.accelerator.empty_host_cache() and its statistics call it; without
// one they read a null pointer). Nothing is cached: a freed block goes back
// to the system at once, so every block counted is active.
#if FLAGOS_HAS_HOST_ALLOCATOR
using HostAllocatorBase = at::HostAllocator;
#else
using HostAllocatorBase = c10::Allocator;
#endif

class PinnedHostAllocator final : public HostAllocatorBase {
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
#if FLAGOS_HAS_HOST_ALLOCATOR
      r.stats.active_requests.increase(1);
      r.stats.active_bytes.increase(n);
      r.stats.allocations.increase(1);
      r.stats.allocated_bytes.increase(n);
      ++r.stats.num_host_alloc;
#endif
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

#if FLAGOS_HAS_HOST_ALLOCATOR
  // Host-driver streams run their work before the call returns: a block is
  // never in use by a stream after it is freed, so there is nothing to wait
  // for. True where the block is one of ours, as CUDA's answers.
  bool record_event(void* ptr, void*, c10::Stream) override { return is_pinned_ptr(ptr); }
  void empty_cache() override {}  // nothing is cached
  at::HostStats get_stats() override {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    return r.stats;
  }
  void reset_accumulated_stats() override {
    with_stats([](c10::CachingAllocator::Stat& stat) { stat.reset_accumulated(); },
               [](at::HostStats& stats) { stats.num_host_alloc = stats.num_host_free = 0; });
  }
  void reset_peak_stats() override {
    with_stats([](c10::CachingAllocator::Stat& stat) { stat.reset_peak(); },
               [](at::HostStats&) {});
  }

 private:
  // Applies `each` to every counted Stat and `rest` to the whole, under the lock.
  template <class Each, class Rest>
  static void with_stats(Each each, Rest rest) {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (c10::CachingAllocator::Stat* stat : {&r.stats.active_requests, &r.stats.active_bytes,
                                              &r.stats.allocations, &r.stats.allocated_bytes}) {
      each(*stat);
    }
    rest(r.stats);
  }
#endif
};

PinnedHostAllocator* the_pinned_allocator() {
  static auto* a = new PinnedHostAllocator();  // leaked: frees run until exit
  return a;
}

}  // namespace

c10::Allocator* pinned_host_allocator() { return the_pinned_allocator(); }

void register_pinned_host_allocator() {
#if FLAGOS_HAS_HOST_ALLOCATOR
  at::setHostAllocator(c10::DeviceType::PrivateUse1, the_pinned_allocator());
#endif
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
