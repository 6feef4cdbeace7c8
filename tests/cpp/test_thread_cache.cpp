// runtime/thread_cache.h: the per-thread free lists behind the objects every
// routed result makes (ResultTensorImpl, FlagosStorage).

#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/thread_cache.h"

namespace {

using torch_fl::runtime::ThreadCache;

// A class that opts in, as the runtime's classes do.
struct Cached {
  explicit Cached(int v) : value(v) {}
  long value;
  char payload[56];
  static void* operator new(size_t n) { return ThreadCache<Cached>::allocate(n); }
  static void operator delete(void* p, size_t n) noexcept { ThreadCache<Cached>::release(p, n); }
};
using Cache = ThreadCache<Cached>;

// A subclass is bigger: its blocks must not enter the base class's list.
struct Bigger : Cached {
  Bigger() : Cached(0) {}
  char more[64];
};

void drain_to_empty() {  // the cache is per thread: start each test from zero
  std::vector<Cached*> taken;
  while (Cache::cached() > 0) taken.push_back(new Cached(0));
  for (Cached* c : taken) ::operator delete(c);
}

TEST(ThreadCache, AFreedObjectsMemoryServesTheNextOneOnTheThread) {
  if (!Cache::kEnabled) GTEST_SKIP() << "off under sanitizers";
  drain_to_empty();
  auto* a = new Cached(1);
  void* where = a;
  delete a;
  EXPECT_EQ(Cache::cached(), 1);
  auto* b = new Cached(2);
  EXPECT_EQ(static_cast<void*>(b), where);
  EXPECT_EQ(b->value, 2);
  EXPECT_EQ(Cache::cached(), 0);
  delete b;
}

TEST(ThreadCache, HoldsAtMostItsCapacity) {
  drain_to_empty();
  std::vector<Cached*> objects;
  for (int i = 0; i < 3 * Cache::kCapacity; ++i) objects.push_back(new Cached(i));
  for (int i = 0; i < 3 * Cache::kCapacity; ++i) EXPECT_EQ(objects[i]->value, i);
  for (Cached* c : objects) delete c;
  EXPECT_EQ(Cache::cached(), Cache::kEnabled ? Cache::kCapacity : 0);
  drain_to_empty();
}

TEST(ThreadCache, OtherSizesGoToTheHeap) {
  drain_to_empty();
  Cached* b = new Bigger();
  delete static_cast<Bigger*>(b);
  EXPECT_EQ(Cache::cached(), 0);
  // A cached block never serves a bigger object.
  delete new Cached(3);
  auto* big = new Bigger();
  big->more[63] = 1;  // the whole object is writable (AddressSanitizer checks it)
  EXPECT_EQ(Cache::cached(), Cache::kEnabled ? 1 : 0);
  delete big;
  drain_to_empty();
}

TEST(ThreadCache, MemoryFreedOnAnotherThreadJoinsThatThreadsList) {
  if (!Cache::kEnabled) GTEST_SKIP() << "off under sanitizers";
  drain_to_empty();
  std::vector<Cached*> made;
  std::thread([&] {
    for (int i = 0; i < 8; ++i) made.push_back(new Cached(i));
  }).join();
  for (Cached* c : made) delete c;
  EXPECT_EQ(Cache::cached(), 8);
  drain_to_empty();
}

// Frees its object from a thread-local destructor that runs after the
// cache's own thread-exit drain.
std::atomic<int> cached_after_late_free{-1};
struct LateFree {
  Cached* object = nullptr;
  ~LateFree() {
    delete object;
    cached_after_late_free = Cache::cached();
  }
};

TEST(ThreadCache, ThreadExitReturnsTheListAndLaterFreesGoToTheHeap) {
  cached_after_late_free = -1;
  std::thread([] {
    // Constructed before the cache's drain is registered, so destroyed after it.
    thread_local LateFree late;
    late.object = new Cached(7);
    std::vector<Cached*> batch;
    for (int i = 0; i < 16; ++i) batch.push_back(new Cached(i));
    for (Cached* c : batch) delete c;  // registers the drain
    EXPECT_EQ(Cache::cached(), Cache::kEnabled ? 16 : 0);
  }).join();
  // The drain emptied the list and the late free bypassed it; a leak or a
  // double free here is AddressSanitizer's to report (scripts/sanitize.sh).
  EXPECT_EQ(cached_after_late_free.load(), 0);
}

}  // namespace
