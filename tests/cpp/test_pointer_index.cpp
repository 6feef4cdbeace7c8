// aten/pointer_index.h: how NativeViews finds one call's views, storages and
// adopted results by pointer. Scans short lists, hashes long ones, indexes
// lazily (entries appended between finds are indexed at the next find), and
// the first entry with a key wins either way.

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "aten/pointer_index.h"

namespace {

using torch_fl::aten::PointerIndex;

struct Entry {
  const void* key;
  int id;
};
constexpr auto by_key = [](const Entry& e) -> const void* { return e.key; };

// Distinct, non-null keys with the spacing heap objects have.
const void* key(size_t i) { return reinterpret_cast<const void*>(uintptr_t{0x10000} + 48 * (i + 1)); }

// The reference: a linear scan, first entry wins.
const Entry* scan(const std::vector<Entry>& list, const void* k) {
  for (const Entry& e : list) {
    if (e.key == k) return &e;
  }
  return nullptr;
}

TEST(PointerIndex, FindsEveryEntryAsAScanDoesAtEverySize) {
  std::vector<Entry> list;
  PointerIndex index;
  for (size_t n = 0; n < 300; ++n) {
    // Each key but one is new; every fifth entry repeats an earlier key,
    // which must not displace the first entry with it.
    list.push_back({n % 5 == 4 ? key(n / 2) : key(n), static_cast<int>(n)});
    for (size_t probe = 0; probe <= n + 1; probe += (n < 40 ? 1 : 7)) {
      const Entry* want = scan(list, key(probe));
      const Entry* got = index.find(list, key(probe), by_key);
      ASSERT_EQ(got, want) << "list of " << list.size() << ", key " << probe;
    }
  }
}

TEST(PointerIndex, EntriesAppendedBetweenFindsAreFound) {
  // Lookups come late and in bursts (a call's results after all of its
  // arguments): the index catches up on every entry added since.
  std::vector<Entry> list;
  list.reserve(5000);
  PointerIndex index;
  std::mt19937 rng(1234);
  size_t next = 0;
  for (int burst = 0; burst < 40; ++burst) {
    const size_t add = rng() % 200;
    for (size_t i = 0; i < add; ++i, ++next) list.push_back({key(next), static_cast<int>(next)});
    for (int q = 0; q < 20; ++q) {
      const size_t probe = next == 0 ? 0 : rng() % (next + 10);  // some beyond the list
      EXPECT_EQ(index.find(list, key(probe), by_key), scan(list, key(probe)));
    }
  }
}

TEST(PointerIndex, AListNeverLookedUpBuildsNothingAndAFindStillWorksLate) {
  std::vector<Entry> list;
  PointerIndex index;
  for (size_t i = 0; i < 1000; ++i) list.push_back({key(i), static_cast<int>(i)});
  // The first find indexes all 1000 entries at once.
  for (size_t i = 0; i < 1000; i += 37) {
    const Entry* e = index.find(list, key(i), by_key);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->id, static_cast<int>(i));
  }
  EXPECT_EQ(index.find(list, key(5000), by_key), nullptr);
}

}  // namespace
