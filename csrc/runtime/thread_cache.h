#pragma once

// Per-thread caches of freed memory for the objects every routed operator
// makes and frees once per result: the flagos TensorImpl (ResultTensorImpl)
// and its FlagosStorage. A class opts in with
//
//   static void* operator new(size_t n) { return ThreadCache<X>::allocate(n); }
//   static void operator delete(void* p, size_t n) { ThreadCache<X>::release(p, n); }
//
// A freed object's memory goes to the freeing thread's list (at most
// kCapacity blocks; the rest to the global heap), and the next object of that
// class made on the thread takes it: a push and a pop instead of malloc and
// free. Memory freed on another thread than it was made on simply joins that
// thread's list. A thread's list returns to the heap when the thread ends;
// objects freed after that (during its thread-local destruction) go straight
// to the heap. Under AddressSanitizer and ThreadSanitizer the cache is off,
// so that a use after free or a race on freed memory stays visible.

#include <cstddef>
#include <new>

namespace torch_fl::runtime {

// Defined by the build only for the cache's own unit tests, which run it
// under the sanitizers too (LeakSanitizer sees a list not drained).
#ifndef FLAGOS_THREAD_CACHE
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLAGOS_THREAD_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FLAGOS_THREAD_CACHE 0
#endif
#endif
#endif
#ifndef FLAGOS_THREAD_CACHE
#define FLAGOS_THREAD_CACHE 1
#endif

template <class T>
class ThreadCache {
 public:
  static constexpr int kCapacity = 64;
  static constexpr bool kEnabled = FLAGOS_THREAD_CACHE != 0;

  static void* allocate(size_t n) {
    if constexpr (kEnabled) {
      List& l = list;
      if (n == sizeof(T) && l.head != nullptr) {
        Node* node = l.head;
        l.head = node->next;
        --l.count;
        return node;
      }
    }
    return ::operator new(n);
  }

  // Blocks the calling thread holds for reuse (for tests).
  static int cached() noexcept { return list.count; }

  static void release(void* p, size_t n) noexcept {
    if constexpr (kEnabled) {
      List& l = list;
      if (n == sizeof(T) && l.state != State::kEnded && l.count < kCapacity) {
        if (l.state == State::kFresh) {  // once per thread
          drainer.touch();  // constructs it, which registers its destructor
          l.state = State::kDrainAtExit;
        }
        auto* node = static_cast<Node*>(p);
        node->next = l.head;
        l.head = node;
        ++l.count;
        return;
      }
    }
    ::operator delete(p);  // unsized: clang before 19 declares no sized form by default
  }

 private:
  static_assert(sizeof(T) >= sizeof(void*), "too small to hold a free-list link");
  struct Node {
    Node* next;
  };
  // Trivially destructible: still readable while, and after, the thread's
  // other thread-locals are destroyed.
  enum class State : unsigned char {
    kFresh,        // nothing cached yet on this thread
    kDrainAtExit,  // the drain is registered
    kEnded,        // the drain ran: free to the heap from now
  };
  struct List {
    Node* head = nullptr;
    int count = 0;
    State state = State::kFresh;
  };
  // Returns the thread's list to the heap when the thread ends.
  struct Drainer {
    void touch() noexcept {}
    ~Drainer() {
      List& l = list;
      l.state = State::kEnded;
      while (l.head != nullptr) {
        Node* next = l.head->next;
        ::operator delete(l.head);
        l.head = next;
      }
      l.count = 0;
    }
  };
  static inline thread_local List list;
  static inline thread_local Drainer drainer;
};

}  // namespace torch_fl::runtime
