#include "runtime/allocator.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include <c10/util/Exception.h>
#include <c10/util/flat_hash_map.h>

#include "runtime/cuda_bridge.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace torch_fl::runtime {
namespace {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kRound = 512;               // allocation granularity
constexpr size_t kSmallLimit = 1 << 20;      // small pool: under 1 MiB
constexpr int kMaxDevices = 64;

struct Block {
  void* ptr;
  size_t size;       // bytes held from the driver (rounded)
  size_t requested;  // bytes the caller asked for
  c10::DeviceIndex device;
  c10::StreamId stream;                 // allocation stream
  std::vector<c10::Stream> used_on;     // extra streams (recordStream)
};

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

struct Pending {
  Block* block;
  std::vector<hal::EventHandle> events;
};

struct DevicePool {
  std::mutex mu;
  std::set<Block*, BlockLess> free_blocks;
  std::vector<Pending> pending;
  DeviceStats stats;
  // Blocks labelled with another device type (the host driver's CPU views),
  // found by address: c10's raw_allocate/raw_deallocate require the context
  // of such a DataPtr to be the data pointer itself.
  ska::flat_hash_map<void*, Block*> raw;
  // set_per_process_memory_fraction: the share of the device's memory this
  // process may hold from the driver, and that share in bytes.
  double fraction = 1.0;
  size_t limit = SIZE_MAX;
};

DevicePool& pool(c10::DeviceIndex device) {
  // Leaked: blocks are freed by tensors that die during interpreter shutdown.
  static auto* pools = new std::array<DevicePool, kMaxDevices>();
  return (*pools)[device];
}

size_t round_size(size_t n) {
  return n == 0 ? kRound : (n + kRound - 1) / kRound * kRound;
}

// A cached block may serve a smaller request if it wastes little.
bool fits(size_t block_size, size_t rounded) {
  return block_size <= std::max(rounded + rounded / 4, rounded + 4096);
}

template <typename F>
void for_pool(size_t size, F&& f) {
  f(static_cast<size_t>(StatType::AGGREGATE));
  f(static_cast<size_t>(size < kSmallLimit ? StatType::SMALL_POOL
                                           : StatType::LARGE_POOL));
}

std::string format_bytes(size_t n) {
  char buf[64];
  if (n >= (size_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", n / double(1 << 30));
  } else if (n >= (size_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB", n / double(1 << 20));
  } else if (n >= 1024) {
    std::snprintf(buf, sizeof buf, "%.2f KiB", n / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%zu bytes", n);
  }
  return buf;
}

// Moves blocks whose streams have finished from pending to the free set.
void process_pending(DevicePool& p, bool wait) {
  auto& d = driver();
  auto it = p.pending.begin();
  while (it != p.pending.end()) {
    bool done = true;
    for (auto e : it->events) {
      if (wait) d.synchronizeEvent(e);
      if (!d.queryEvent(e)) done = false;
    }
    if (!done) {
      ++it;
      continue;
    }
    for (auto e : it->events) d.destroyEvent(e);
    p.free_blocks.insert(it->block);
    it = p.pending.erase(it);
  }
}

// Returns every cached block of the device to the driver. Caller holds p.mu.
void release_cache(DevicePool& p, c10::DeviceIndex device) {
  process_pending(p, /*wait=*/true);
  auto& d = driver();
  for (Block* b : p.free_blocks) {
    d.deallocate(device, b->ptr, b->size);
    for_pool(b->size, [&](size_t i) { p.stats.segment[i].decrease(1); });
    for_pool(b->size, [&](size_t i) { p.stats.reserved_bytes[i].decrease(b->size); });
    p.stats.num_device_free++;
    delete b;
  }
  p.free_blocks.clear();
}

// torch.profiler(profile_memory=True) records a memory event per allocation
// and free, as for CUDA's caching allocator; without a profiler this is one
// thread-local read. Caller holds p.mu.
void report_to_profiler(const DevicePool& p, const Block& b, int64_t delta) {
  c10::reportMemoryUsageToProfiler(
      b.ptr, delta, static_cast<size_t>(p.stats.allocated_bytes[0].current),
      static_cast<size_t>(p.stats.reserved_bytes[0].current), c10::Device(kFlagos, b.device));
}

// Caller holds p.mu.
void free_block_locked(DevicePool& p, Block* b) {
  for_pool(b->size, [&](size_t i) {
    p.stats.allocation[i].decrease(1);
    p.stats.active[i].decrease(1);
    p.stats.allocated_bytes[i].decrease(b->size);
    p.stats.active_bytes[i].decrease(b->size);
    p.stats.requested_bytes[i].decrease(b->requested);
  });
  report_to_profiler(p, *b, -static_cast<int64_t>(b->size));
  if (b->used_on.empty()) {
    p.free_blocks.insert(b);
    return;
  }
  // Used on other streams: reusable once their work up to now has finished.
  Pending pend{b, {}};
  auto& d = driver();
  for (const auto& s : b->used_on) {
    // The event belongs to the stream's device, which may be another than the
    // block's (a cross-device copy recorded on the destination's stream).
    auto e = d.createEvent(s.device_index(), /*enable_timing=*/false);
    d.recordEvent(e, stream_handle(s));
    pend.events.push_back(e);
  }
  b->used_on.clear();
  p.pending.push_back(std::move(pend));
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  auto& p = pool(b->device);
  std::lock_guard<std::mutex> lock(p.mu);
  free_block_locked(p, b);
}

// Frees the raw-labelled block at `ptr`, if it is one of ours (one lock:
// the pool's, which guards its index too).
bool take_and_free_raw(void* ptr) noexcept {
  const c10::DeviceIndex n = device_count();
  for (c10::DeviceIndex d = 0; d < n; ++d) {
    auto& p = pool(d);
    std::lock_guard<std::mutex> lock(p.mu);
    auto it = p.raw.find(ptr);
    if (it == p.raw.end()) continue;
    Block* b = it->second;
    p.raw.erase(it);
    free_block_locked(p, b);
    return true;
  }
  return false;
}

void free_raw(void* ptr) {
  const bool freed = take_and_free_raw(ptr);
  TORCH_INTERNAL_ASSERT(freed, "flagos: freeing an unknown pointer");
}

}  // namespace

bool free_if_owned(void* ptr) noexcept { return take_and_free_raw(ptr); }

c10::DataPtr FlagosAllocator::allocate(size_t nbytes) {
  return allocate_on(current_device(), nbytes, kFlagos);
}

c10::DataPtr FlagosAllocator::allocate_on(c10::DeviceIndex device,
                                          size_t nbytes,
                                          c10::DeviceType label) {
  lazy_init();
  TORCH_CHECK(device >= 0 && device < device_count(),
              "flagos allocation on invalid device ", static_cast<int>(device));
  // The cuda driver's memory is PyTorch's CUDA caching allocator: one pool
  // for flagos and torch.cuda, and CUDA kernels' outputs are flagos memory.
  if (uses_cuda()) return cuda::allocate(device, nbytes);
  c10::Device dev(label, label == kFlagos ? device : -1);
  if (nbytes == 0) return c10::DataPtr(nullptr, dev);
  const size_t size = round_size(nbytes);
  const c10::StreamId stream = current_stream_id_unchecked(device);
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.pending.empty()) process_pending(p, /*wait=*/false);

  Block key{nullptr, size, 0, device, stream, {}};
  Block* b = nullptr;
  auto it = p.free_blocks.lower_bound(&key);
  if (it != p.free_blocks.end() && (*it)->stream == stream && fits((*it)->size, size)) {
    b = *it;
    p.free_blocks.erase(it);
  } else {
    auto& d = driver();
    // The machine is short of memory although the driver would still hand
    // some out (the host driver, until the OOM killer strikes): the cache goes
    // back first, as CUDA's does when cudaMalloc fails. Asked only when there
    // is a cache to give back and the block is large (asking reads /proc).
    if (size >= kSmallLimit && (!p.free_blocks.empty() || !p.pending.empty()) &&
        d.memoryIsShort(device, size)) {
      p.stats.num_alloc_retries++;
      release_cache(p, device);
    }
    // Within the process's share (set_per_process_memory_fraction), as the
    // reserved bytes count it; the cache is emptied before giving up.
    const auto within_limit = [&] {
      return static_cast<size_t>(p.stats.reserved_bytes[0].current) + size <= p.limit;
    };
    void* ptr = within_limit() ? d.allocate(device, size) : nullptr;
    if (ptr == nullptr) {
      p.stats.num_alloc_retries++;
      release_cache(p, device);
      if (within_limit()) ptr = d.allocate(device, size);
    }
    if (ptr == nullptr) {
      // Opening as CUDA's message does ("... out of memory. Tried to
      // allocate"): libraries that retry with smaller batches match that text
      // (accelerate's find_executable_batch_size, Trainer's auto_find_batch_size).
      p.stats.num_ooms++;
      auto info = d.memoryInfo(device);
      auto allocated = p.stats.allocated_bytes[0].current;
      TORCH_CHECK_WITH(
          OutOfMemoryError, within_limit(), "flagos out of memory. Tried to allocate ",
          format_bytes(nbytes), " on device ", static_cast<int>(device),
          ", but this process may hold ", format_bytes(p.limit), " (",
          p.fraction, " of the device's ", format_bytes(info.total_bytes),
          ", set by set_per_process_memory_fraction), and ", format_bytes(allocated),
          " is held by flagos tensors; the flagos cache was emptied before this error.");
      TORCH_CHECK_WITH(
          OutOfMemoryError, false, "flagos out of memory. Tried to allocate ",
          format_bytes(nbytes), " on device ", static_cast<int>(device), ". The device has ",
          format_bytes(info.total_bytes), " in all, ", format_bytes(info.free_bytes), " free; ",
          format_bytes(allocated),
          " is held by flagos tensors and the flagos cache was emptied before "
          "this error.",
          d.name() == "host"
              ? " (The host driver's capacity is FLAGOS_HOST_MEMORY_LIMIT.)"
              : "");
    }
    b = new Block{ptr, size, 0, device, stream, {}};
    p.stats.num_device_alloc++;
    for_pool(size, [&](size_t i) {
      p.stats.segment[i].increase(1);
      p.stats.reserved_bytes[i].increase(size);
    });
  }
  b->requested = nbytes;
  // The block's own size: a reused cached block may be larger than the
  // request, and free_block() subtracts the block's size.
  for_pool(b->size, [&](size_t i) {
    p.stats.allocation[i].increase(1);
    p.stats.active[i].increase(1);
    p.stats.allocated_bytes[i].increase(b->size);
    p.stats.active_bytes[i].increase(b->size);
    p.stats.requested_bytes[i].increase(nbytes);
  });
  report_to_profiler(p, *b, static_cast<int64_t>(b->size));
  if (label != kFlagos) {
    p.raw.emplace(b->ptr, b);
    return c10::DataPtr(b->ptr, b->ptr, &free_raw, dev);
  }
  return c10::DataPtr(b->ptr, b, &free_block, dev);
}

c10::DeleterFnPtr FlagosAllocator::raw_deleter() const { return nullptr; }

void FlagosAllocator::copy_data(void* dest, const void* src,
                                size_t count) const {
  driver().copy(dest, src, count, hal::CopyKind::kDeviceToDevice, nullptr,
                /*async=*/false);
}

bool FlagosAllocator::initialized() { return true; }

void FlagosAllocator::emptyCache(c10::MempoolId_t) {
  if (uses_cuda()) return cuda::empty_cache();
  auto n = device_count();
  for (c10::DeviceIndex i = 0; i < n; ++i) {
    auto& p = pool(i);
    std::lock_guard<std::mutex> lock(p.mu);
    release_cache(p, i);
  }
}

void FlagosAllocator::recordStream(const c10::DataPtr& ptr,
                                   c10::Stream stream) {
  if (uses_cuda()) return cuda::record_stream(ptr, stream);
  // As CUDA's: a stream of another device type is refused, and a stream that
  // does not exist is refused here, not when the tensor is freed (a deleter
  // that throws ends the process).
  TORCH_CHECK_VALUE(stream.device_type() == kFlagos,
                    "record_stream: a flagos tensor is recorded on a flagos stream, not on a ",
                    stream.device_type(), " stream");
  stream_handle(stream);  // raises for an unknown stream id or device
  // Memory flagos' pools did not hand out (from_blob) is not tracked.
  if (ptr.get_deleter() != &free_block) return;
  auto* b = static_cast<Block*>(ptr.get_context());
  if (stream.device_index() == b->device && stream.id() == b->stream) return;
  auto& p = pool(b->device);
  std::lock_guard<std::mutex> lock(p.mu);
  if (std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end())
    b->used_on.push_back(stream);
}

DeviceStats FlagosAllocator::getDeviceStats(c10::DeviceIndex device) {
  device = resolve_device(device);
  if (uses_cuda()) return cuda::stats(device);
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  DeviceStats stats = p.stats;
  // No block is ever split: no size limit on splitting, which CUDA's
  // allocator reports as SIZE_MAX (-1 in Python).
  stats.max_split_size = static_cast<int64_t>(SIZE_MAX);
  return stats;
}

void FlagosAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  device = resolve_device(device);
  if (uses_cuda()) return cuda::reset_accumulated(device);
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  auto reset = [](auto& arr) {
    for (auto& s : arr) s.reset_accumulated();
  };
  reset(p.stats.allocation);
  reset(p.stats.segment);
  reset(p.stats.active);
  reset(p.stats.allocated_bytes);
  reset(p.stats.reserved_bytes);
  reset(p.stats.active_bytes);
  reset(p.stats.requested_bytes);
  p.stats.num_alloc_retries = 0;
  p.stats.num_ooms = 0;
  p.stats.num_device_alloc = 0;
  p.stats.num_device_free = 0;
}

void FlagosAllocator::resetPeakStats(c10::DeviceIndex device) {
  device = resolve_device(device);
  if (uses_cuda()) return cuda::reset_peak(device);
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  auto reset = [](auto& arr) {
    for (auto& s : arr) s.reset_peak();
  };
  reset(p.stats.allocation);
  reset(p.stats.segment);
  reset(p.stats.active);
  reset(p.stats.allocated_bytes);
  reset(p.stats.reserved_bytes);
  reset(p.stats.active_bytes);
  reset(p.stats.requested_bytes);
}

void FlagosAllocator::setMemoryFraction(c10::DeviceIndex device, double fraction) {
  TORCH_CHECK_VALUE(fraction >= 0.0 && fraction <= 1.0, "invalid memory fraction ", fraction,
                    ": the allowed range is 0 to 1");
  device = resolve_device(device);
  if (uses_cuda()) return cuda::set_memory_fraction(device, fraction);
  const size_t total = driver().memoryInfo(device).total_bytes;
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  p.fraction = fraction;
  p.limit = fraction >= 1.0 ? SIZE_MAX : static_cast<size_t>(fraction * static_cast<double>(total));
}

double FlagosAllocator::memoryFraction(c10::DeviceIndex device) {
  device = resolve_device(device);
  if (uses_cuda()) return cuda::memory_fraction(device);
  auto& p = pool(device);
  std::lock_guard<std::mutex> lock(p.mu);
  return p.fraction;
}

std::pair<size_t, size_t> FlagosAllocator::getMemoryInfo(
    c10::DeviceIndex device) {
  auto info = driver().memoryInfo(resolve_device(device));
  return {info.free_bytes, info.total_bytes};
}

bool FlagosAllocator::owns(const c10::DataPtr& ptr) noexcept {
  return ptr.get_deleter() == &free_block || ptr.get_deleter() == &free_raw ||
         (uses_cuda() && cuda::owns(ptr));
}

FlagosAllocator& device_allocator() {
  static FlagosAllocator* instance = [] {
    auto* a = new FlagosAllocator();  // leaked: frees run until exit
    c10::SetAllocator(kFlagos, a);
    return a;
  }();
  return *instance;
}

// Registered at load so that PyTorch finds it before the first allocation.
static const bool kRegistered = (device_allocator(), true);

}  // namespace torch_fl::runtime
