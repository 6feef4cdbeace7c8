#include "hal/host_driver.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "hal/env.h"
#include "hal/system_memory.h"

namespace torch_fl::hal {
namespace {

constexpr size_t kAlignment = 64;  // a cache line; also enough for AVX-512 loads
// Blocks from 1 MiB are mapped pages of their own, so that freeing one (the
// caching allocator's empty_cache, or its release when memory is short) gives
// the memory back to the machine: glibc keeps freed heap blocks below its
// mmap threshold, which grows to 32 MiB as large blocks are freed.
constexpr size_t kMappedMin = size_t{1} << 20;

size_t mapped_size(size_t nbytes) {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (nbytes + page - 1) / page * page;
}
constexpr long kMaxHostDevices = 64;

using Clock = std::chrono::steady_clock;

struct HostStream {
  int device;
  int priority;
};

struct HostEvent {
  int device;
  bool timing;
  bool recorded = false;
  Clock::time_point when{};
};

thread_local int tls_current_device = 0;

size_t physical_memory() {
  struct sysinfo info {};
  if (sysinfo(&info) != 0) return 0;
  return static_cast<size_t>(info.totalram) * info.mem_unit;
}

}  // namespace

struct HostDriver::Device {
  std::atomic<size_t> used{0};
  HostStream default_stream{0, 0};
};

HostDriver::HostDriver()
    : HostDriver(static_cast<int>(env_int("FLAGOS_HOST_DEVICES", 1, 1,
                                          kMaxHostDevices)),
                 env_byte_size("FLAGOS_HOST_MEMORY_LIMIT")) {}

void HostDriver::check_environment() {
  env_int("FLAGOS_HOST_DEVICES", 1, 1, kMaxHostDevices);
  env_byte_size("FLAGOS_HOST_MEMORY_LIMIT");
}

HostDriver::HostDriver(int device_count, std::optional<size_t> capacity)
    : capacity_(capacity) {
  if (device_count < 1 || device_count > kMaxHostDevices) {
    throw ConfigError("host driver device count " + std::to_string(device_count) +
                      " is out of range 1.." + std::to_string(kMaxHostDevices));
  }
  for (int i = 0; i < device_count; ++i) {
    devices_.push_back(std::make_unique<Device>());
    devices_.back()->default_stream.device = i;
  }
}

HostDriver::~HostDriver() = default;

int HostDriver::deviceCount() const noexcept {
  return static_cast<int>(devices_.size());
}

void HostDriver::setDevice(int device) { tls_current_device = device; }

int HostDriver::currentDevice() const { return tls_current_device; }

void HostDriver::synchronizeDevice(int /*device*/) {
  // Work runs inline: nothing can be pending.
}

void* HostDriver::allocate(int device, size_t nbytes) {
  if (nbytes == 0) return nullptr;
  auto& used = devices_[device]->used;
  if (capacity_) {
    // Reserve first so that concurrent allocations cannot overshoot together.
    size_t before = used.fetch_add(nbytes);
    if (before + nbytes > *capacity_) {
      used.fetch_sub(nbytes);
      return nullptr;
    }
  } else {
    used.fetch_add(nbytes);
  }
  void* p = nullptr;
  if (nbytes >= kMappedMin) {
    p = ::mmap(nullptr, mapped_size(nbytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    if (p == MAP_FAILED) p = nullptr;
  } else {
    p = std::aligned_alloc(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  if (p == nullptr) used.fetch_sub(nbytes);
  return p;
}

void HostDriver::deallocate(int device, void* ptr, size_t nbytes) noexcept {
  if (ptr == nullptr) return;
  if (nbytes >= kMappedMin) {
    ::munmap(ptr, mapped_size(nbytes));
  } else {
    std::free(ptr);
  }
  devices_[device]->used.fetch_sub(nbytes);
}

MemoryInfo HostDriver::memoryInfo(int device) const {
  const size_t total = capacity_ ? *capacity_ : physical_memory();
  const size_t used = devices_[device]->used.load();
  // Free memory is also what the machine can still give: as a GPU's free
  // memory counts every process on it, other processes, the page cache the
  // kernel cannot reclaim and cgroup limits count here.
  return {std::min(used >= total ? 0 : total - used, system_available_memory()), total};
}

bool HostDriver::memoryIsShort(int /*device*/, size_t nbytes) const {
  return nbytes > system_available_memory(nbytes);
}

void HostDriver::copy(void* dst, const void* src, size_t nbytes,
                      CopyKind /*kind*/, StreamHandle /*stream*/,
                      bool /*async*/) {
  if (nbytes == 0) return;
  // memmove: a copy between overlapping views of one storage is legal.
  std::memmove(dst, src, nbytes);
}

StreamHandle HostDriver::defaultStream(int device) {
  return &devices_[device]->default_stream;
}

StreamHandle HostDriver::createStream(int device, int priority) {
  return new HostStream{device, priority};
}

void HostDriver::destroyStream(StreamHandle stream) noexcept {
  auto* s = static_cast<HostStream*>(stream);
  if (s != &devices_[s->device]->default_stream) delete s;
}

bool HostDriver::queryStream(StreamHandle /*stream*/) { return true; }

void HostDriver::synchronizeStream(StreamHandle /*stream*/) {}

EventHandle HostDriver::createEvent(int device, bool enable_timing) {
  return new HostEvent{device, enable_timing};
}

void HostDriver::destroyEvent(EventHandle event) noexcept {
  delete static_cast<HostEvent*>(event);
}

void HostDriver::recordEvent(EventHandle event, StreamHandle stream) {
  auto* e = static_cast<HostEvent*>(event);
  auto* s = static_cast<HostStream*>(stream);
  if (e->device != s->device) {
    throw Error("event of flagos:" + std::to_string(e->device) +
                " cannot be recorded on a stream of flagos:" +
                std::to_string(s->device));
  }
  e->recorded = true;
  e->when = Clock::now();
}

bool HostDriver::queryEvent(EventHandle /*event*/) { return true; }

void HostDriver::synchronizeEvent(EventHandle /*event*/) {}

void HostDriver::streamWaitEvent(StreamHandle /*stream*/,
                                 EventHandle /*event*/) {}

double HostDriver::elapsedMs(EventHandle start, EventHandle end) {
  auto* a = static_cast<HostEvent*>(start);
  auto* b = static_cast<HostEvent*>(end);
  if (!a->timing || !b->timing) {
    throw Error(
        "elapsed_time needs both events created with enable_timing=True");
  }
  if (!a->recorded || !b->recorded) {
    throw Error("elapsed_time needs both events to be recorded first");
  }
  if (a->device != b->device) {  // as CUDA refuses events of two devices
    throw Error("elapsed_time needs both events on one device, got events of flagos:" +
                std::to_string(a->device) + " and flagos:" + std::to_string(b->device));
  }
  return std::chrono::duration<double, std::milli>(b->when - a->when).count();
}

}  // namespace torch_fl::hal
