#pragma once

// Positions in one call's list (NativeViews' views, storages and adopted
// results) by a pointer key. Almost every call has a handful of tensors: a
// linear scan, no hashing, no allocation. A call over long tensor lists (a
// `_foreach_*` optimizer step over every parameter, `cat` of hundreds of
// tensors) would make the scans quadratic, so once a list outgrows the scan
// the index hashes its keys (open addressing, at most half full). Entries are
// indexed lazily, when a find() needs them: most calls over long lists never
// look anything up (an in-place foreach op, a result in fresh memory), and
// then pay nothing for the index. The first entry with a key wins, as in a
// scan.

#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <new>

namespace torch_fl::aten {

class PointerIndex {
 public:
  static constexpr size_t kScanLimit = 16;

  PointerIndex() noexcept = default;
  PointerIndex(const PointerIndex&) = delete;
  PointerIndex& operator=(const PointerIndex&) = delete;
  ~PointerIndex() {
    if (table_ != nullptr) destroy();
  }

  // The first entry of `list` whose key_of(entry) is `key`, or null. `list`
  // only grows between finds (entries are appended, never removed).
  template <class List, class KeyOf>
  auto* find(List& list, const void* key, KeyOf key_of) {
    decltype(&list[0]) found = nullptr;
    if (list.size() > kScanLimit && list.size() != indexed_) catch_up(list, key_of);
    if (table_ == nullptr) {
      for (auto& entry : list) {
        if (key_of(entry) == key) {
          found = &entry;
          break;
        }
      }
    } else if (const Slot* slot = table_->find(key); slot->key != nullptr) {
      found = &list[slot->position];
    }
    return found;
  }

 private:
  struct Slot {
    const void* key;  // null: empty (lists hold no null keys)
    uint32_t position;
  };
  // One allocation: the header, then mask + 1 slots.
  struct Table {
    size_t mask;
    size_t count;
    int shift;
    Slot* slots() { return reinterpret_cast<Slot*>(this + 1); }
    Slot* find(const void* key) {  // the key's slot, or the empty slot that ends its probe
      Slot* s = slots();
      size_t i = (reinterpret_cast<uintptr_t>(key) * 0x9E3779B97F4A7C15ull) >> shift;  // Fibonacci
      while (s[i].key != key && s[i].key != nullptr) i = (i + 1) & mask;
      return &s[i];
    }
    void insert(const void* key, size_t position) {
      Slot* slot = find(key);
      if (slot->key != nullptr) return;  // the first entry with the key stays
      *slot = {key, static_cast<uint32_t>(position)};
      ++count;
    }
  };

  // Indexes the entries appended since the last find.
  template <class List, class KeyOf>
  void catch_up(const List& list, KeyOf key_of) {
    if (table_ != nullptr && 2 * list.size() <= table_->mask + 1) {
      for (size_t i = indexed_; i < list.size(); ++i) table_->insert(key_of(list[i]), i);
    } else {
      rebuild(list, key_of);
    }
    indexed_ = list.size();
  }

  template <class List, class KeyOf>
  void rebuild(const List& list, KeyOf key_of) {
    size_t capacity = 4 * kScanLimit;
    while (capacity < 2 * list.size()) capacity *= 2;
    if (table_ != nullptr) destroy();
    table_ = static_cast<Table*>(::operator new(sizeof(Table) + capacity * sizeof(Slot)));
    table_->mask = capacity - 1;
    table_->count = 0;
    table_->shift = 64 - __builtin_ctzll(capacity);
    std::fill_n(table_->slots(), capacity, Slot{nullptr, 0});
    for (size_t i = 0; i < list.size(); ++i) table_->insert(key_of(list[i]), i);
  }

  void destroy() noexcept { ::operator delete(table_); }

  Table* table_ = nullptr;  // null while scanning
  size_t indexed_ = 0;      // entries of the list in table_
};

}  // namespace torch_fl::aten
