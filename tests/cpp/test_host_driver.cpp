// The host driver: memory with capacity, copies, streams and events.

#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "hal/host_driver.h"
#include "hal/system_memory.h"

using torch_fl::hal::CopyKind;
using torch_fl::hal::Error;
using torch_fl::hal::HostDriver;

namespace {
// Holds what the machine reports as available (system_available_memory) at
// the bytes given, until the test ends, however it ends.
struct MachineMemory {
  explicit MachineMemory(size_t bytes) { set(bytes); }
  ~MachineMemory() { torch_fl::hal::override_available_memory(std::nullopt); }
  void set(size_t bytes) { torch_fl::hal::override_available_memory(bytes); }
};
}  // namespace

TEST(HostDriver, CountsDevicesAndTracksCurrentPerThread) {
  HostDriver d(3, std::nullopt);
  EXPECT_EQ(d.deviceCount(), 3);
  EXPECT_EQ(d.currentDevice(), 0);
  d.setDevice(2);
  EXPECT_EQ(d.currentDevice(), 2);
  int other = -1;
  std::thread([&] { other = d.currentDevice(); }).join();
  EXPECT_EQ(other, 0) << "current device must be per thread";
  d.setDevice(0);
}

TEST(HostDriver, RejectsBadDeviceCount) {
  EXPECT_THROW(HostDriver(0, std::nullopt), torch_fl::hal::ConfigError);
  EXPECT_THROW(HostDriver(65, std::nullopt), torch_fl::hal::ConfigError);
}

TEST(HostDriver, AllocationIsAlignedAndWritable) {
  HostDriver d(1, std::nullopt);
  void* p = d.allocate(0, 1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 0xab, 1000);
  d.deallocate(0, p, 1000);
}

TEST(HostDriver, CapacityIsEnforcedPerDeviceAndFreed) {
  HostDriver d(2, size_t(1) << 20);
  void* a = d.allocate(0, 768 << 10);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(d.allocate(0, 512 << 10), nullptr) << "over capacity must fail";
  void* b = d.allocate(1, 768 << 10);
  EXPECT_NE(b, nullptr) << "capacity is per device";
  auto info = d.memoryInfo(0);
  EXPECT_EQ(info.total_bytes, size_t(1) << 20);
  EXPECT_EQ(info.free_bytes, (size_t(1) << 20) - (768 << 10));
  d.deallocate(0, a, 768 << 10);
  void* c = d.allocate(0, 1 << 20);
  EXPECT_NE(c, nullptr) << "freed bytes must be reusable";
  d.deallocate(0, c, 1 << 20);
  d.deallocate(1, b, 768 << 10);
}

TEST(HostDriver, ConcurrentAllocationsNeverOvershootCapacity) {
  const size_t cap = 64 << 10, chunk = 4 << 10;
  HostDriver d(1, cap);
  std::vector<std::thread> threads;
  std::atomic<size_t> held{0}, peak{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        void* p = d.allocate(0, chunk);
        if (p == nullptr) continue;
        size_t now = held.fetch_add(chunk) + chunk;
        size_t prev = peak.load();
        while (now > prev && !peak.compare_exchange_weak(prev, now)) {}
        held.fetch_sub(chunk);
        d.deallocate(0, p, chunk);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(peak.load(), cap);
  EXPECT_EQ(d.memoryInfo(0).free_bytes, cap);
}

TEST(HostDriver, CopiesInEveryDirectionPreserveBytes) {
  HostDriver d(2, std::nullopt);
  std::mt19937 rng(std::random_device{}());
  std::vector<uint8_t> src(4096), back(4096);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  void* dev0 = d.allocate(0, src.size());
  void* dev1 = d.allocate(1, src.size());
  auto s = d.defaultStream(0);
  d.copy(dev0, src.data(), src.size(), CopyKind::kHostToDevice, s, false);
  d.copy(dev1, dev0, src.size(), CopyKind::kDeviceToDevice, s, true);
  d.synchronizeStream(s);
  d.copy(back.data(), dev1, src.size(), CopyKind::kDeviceToHost, s, false);
  EXPECT_EQ(src, back);
  d.deallocate(0, dev0, src.size());
  d.deallocate(1, dev1, src.size());
}

TEST(HostDriver, OverlappingDeviceCopyIsAMove) {
  HostDriver d(1, std::nullopt);
  auto* p = static_cast<int*>(d.allocate(0, 10 * sizeof(int)));
  std::iota(p, p + 10, 0);
  d.copy(p + 1, p, 9 * sizeof(int), CopyKind::kDeviceToDevice,
         d.defaultStream(0), false);
  for (int i = 1; i < 10; ++i) EXPECT_EQ(p[i], i - 1);
  d.deallocate(0, p, 10 * sizeof(int));
}

TEST(HostDriver, EventsMeasureElapsedTime) {
  HostDriver d(1, std::nullopt);
  auto s = d.createStream(0, 0);
  auto a = d.createEvent(0, true), b = d.createEvent(0, true);
  d.recordEvent(a, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  d.recordEvent(b, s);
  d.streamWaitEvent(d.defaultStream(0), b);
  EXPECT_TRUE(d.queryEvent(b));
  double ms = d.elapsedMs(a, b);
  EXPECT_GE(ms, 19.0);
  EXPECT_LT(ms, 2000.0);
  d.destroyEvent(a);
  d.destroyEvent(b);
  d.destroyStream(s);
}

TEST(HostDriver, ElapsedTimeNeedsTimingAndRecordedEvents) {
  HostDriver d(1, std::nullopt);
  auto s = d.defaultStream(0);
  auto timed = d.createEvent(0, true), untimed = d.createEvent(0, false);
  auto never = d.createEvent(0, true);
  d.recordEvent(timed, s);
  d.recordEvent(untimed, s);
  EXPECT_THROW(d.elapsedMs(timed, untimed), Error);
  EXPECT_THROW(d.elapsedMs(timed, never), Error);
  d.destroyEvent(timed);
  d.destroyEvent(untimed);
  d.destroyEvent(never);
}

TEST(HostDriver, ElapsedTimeNeedsEventsOfOneDevice) {
  HostDriver d(2, std::nullopt);
  auto a = d.createEvent(0, true), b = d.createEvent(1, true);
  d.recordEvent(a, d.defaultStream(0));
  d.recordEvent(b, d.defaultStream(1));
  EXPECT_THROW(d.elapsedMs(a, b), Error);
  d.destroyEvent(a);
  d.destroyEvent(b);
}

TEST(HostDriver, EventOfOneDeviceCannotBeRecordedOnAnother) {
  HostDriver d(2, std::nullopt);
  auto e = d.createEvent(0, false);
  EXPECT_THROW(d.recordEvent(e, d.defaultStream(1)), Error);
  d.destroyEvent(e);
}

// Without a capacity, the host driver's allocations succeed until the OOM
// killer strikes: it tells the caching allocator when the machine is short.
TEST(HostDriver, MemoryIsShortWhenTheMachineHasLessThanAsked) {
  HostDriver d(1, std::nullopt);
  MachineMemory machine(size_t(8) << 20);
  EXPECT_FALSE(d.memoryIsShort(0, size_t(8) << 20));
  EXPECT_TRUE(d.memoryIsShort(0, (size_t(8) << 20) + 1));
  machine.set(0);
  EXPECT_TRUE(d.memoryIsShort(0, 1));
  // A capacity larger than the machine does not hide a short machine.
  HostDriver capped(1, size_t(1) << 40);
  EXPECT_TRUE(capped.memoryIsShort(0, size_t(1) << 20));
}

TEST(HostDriver, FreeMemoryIsNoMoreThanTheMachineCanGive) {
  MachineMemory machine(size_t(8) << 20);
  EXPECT_EQ(HostDriver(1, std::nullopt).memoryInfo(0).free_bytes, size_t(8) << 20);
  EXPECT_EQ(HostDriver(1, size_t(1) << 30).memoryInfo(0).free_bytes, size_t(8) << 20);
  HostDriver small(1, size_t(1) << 20);  // a capacity below the machine's free memory
  EXPECT_EQ(small.memoryInfo(0).free_bytes, size_t(1) << 20);
  EXPECT_EQ(small.memoryInfo(0).total_bytes, size_t(1) << 20);
}

TEST(HostDriver, LargeBlocksAreMappedAndWritable) {
  HostDriver d(1, std::nullopt);
  MachineMemory machine(SIZE_MAX);  // the machine's figure moves with other processes
  for (size_t n : {size_t(1) << 20, (size_t(3) << 20) + 123}) {
    auto* p = static_cast<unsigned char*>(d.allocate(0, n));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    std::memset(p, 0x5a, n);
    EXPECT_EQ(p[n - 1], 0x5a);
    EXPECT_EQ(d.memoryInfo(0).total_bytes - d.memoryInfo(0).free_bytes, n);
    d.deallocate(0, p, n);
  }
}

TEST(SystemMemory, ReadsMemAvailable) {
  using torch_fl::hal::meminfo_available;
  EXPECT_EQ(meminfo_available("MemTotal:  24683656 kB\nMemFree:   23299788 kB\n"
                              "MemAvailable:   23700536 kB\nBuffers: 1 kB\n"),
            size_t(23700536) * 1024);
  EXPECT_FALSE(meminfo_available("MemTotal: 1 kB\n").has_value());
  EXPECT_FALSE(meminfo_available("MemAvailable: garbage\n").has_value());
  EXPECT_FALSE(meminfo_available("XMemAvailable: 5 kB\n").has_value());
}

TEST(SystemMemory, CgroupHeadroomLeavesOutReclaimableCache) {
  using torch_fl::hal::cgroup_headroom;
  EXPECT_EQ(cgroup_headroom("1073741824\n", "1000\n", ""), size_t(1073741824) - 1000);
  EXPECT_EQ(cgroup_headroom("1000\n", "2000\n", ""), size_t(0));  // over the limit: none left
  EXPECT_FALSE(cgroup_headroom("max\n", "1000\n", "").has_value());
  // A group full of page cache still has room: the kernel reclaims it first.
  EXPECT_EQ(cgroup_headroom("4096\n", "4000\n", "active_file 10\ninactive_file 3000\n"),
            size_t(4096 - 1000));
  EXPECT_EQ(cgroup_headroom("4096\n", "4000\n", "total_inactive_file 3000\n",
                            "total_inactive_file"),
            size_t(4096 - 1000));
  EXPECT_EQ(cgroup_headroom("4096\n", "100\n", "inactive_file 3000\n"), size_t(4096));
}

TEST(SystemMemory, FindsTheProcessCgroupAndItsAncestors) {
  using torch_fl::hal::cgroup_memory_dirs;
  using V = std::vector<std::string>;
  EXPECT_EQ(cgroup_memory_dirs("0::/user.slice/job/step\n", "/v2", "/v1"),
            (V{"/v2/user.slice/job/step", "/v2/user.slice/job", "/v2/user.slice", "/v2"}));
  EXPECT_EQ(cgroup_memory_dirs("0::/", "/v2", "/v1"), (V{"/v2"}));
  // v1 (and hybrid: a v1 memory controller beside an empty v2 tree)
  EXPECT_EQ(cgroup_memory_dirs("9:name=systemd:/\n4:memory:/a/b\n1:cpu:/\n0::/", "/v2", "/v1"),
            (V{"/v1/a/b", "/v1/a", "/v1"}));
  EXPECT_EQ(cgroup_memory_dirs("5:cpuacct,memory:/x", "/v2", "/v1"), (V{"/v1/x", "/v1"}));
  EXPECT_TRUE(cgroup_memory_dirs("garbage", "/v2", "/v1").empty());
  EXPECT_TRUE(cgroup_memory_dirs("", "/v2", "/v1").empty());
}

TEST(SystemMemory, OverrideIsWhatTheMachineReads) {
  using torch_fl::hal::override_available_memory;
  using torch_fl::hal::system_available_memory;
  override_available_memory(size_t(12345));
  EXPECT_EQ(system_available_memory(), size_t(12345));
  override_available_memory(std::nullopt);
  EXPECT_NE(system_available_memory(), size_t(12345));
}
