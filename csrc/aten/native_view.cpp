#include "aten/native_view.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <algorithm>
#include <array>
#include <memory>
#include <typeinfo>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/native_allocation.h"
#include "runtime/result_tensor.h"
#include "runtime/storage.h"

namespace torch_fl::aten {
namespace {

using runtime::FlagosStorage;
using runtime::kFlagos;

// IntArrayRef's == calls memcmp: for the few dimensions of a tensor, a loop is
// half the instructions.
bool same(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// Whether a kept native view still describes the flagos tensor exactly: over
// its storage's twin, with its dtype, geometry and conj/neg/zero bits.
C10_ALWAYS_INLINE bool describes(const at::Tensor& native, const c10::TensorImpl* flagos,
                                  const c10::StorageImpl* twin) {
  const c10::TensorImpl* n = native.unsafeGetTensorImpl();
  using runtime::kFlagKeys;
  return n->unsafe_storage().unsafeGetStorageImpl() == twin && n->dtype() == flagos->dtype() &&
         n->storage_offset() == flagos->storage_offset() &&
         (n->key_set() & kFlagKeys) == (flagos->key_set() & kFlagKeys) &&
         same(n->sizes(), flagos->sizes()) && same(n->strides(), flagos->strides());
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key,
                     const at::Tensor& like) {
  // The flags go in with the keys: ZeroTensor's only a constructor may give.
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key) | (like.key_set() & runtime::kFlagKeys),
      like.dtype());
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  return at::Tensor(std::move(impl));
}

[[noreturn]] C10_NOINLINE void refuse_layout(const at::Tensor& native) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "a kernel returned a tensor of layout ", native.layout(),
                              ", but flagos tensors are strided, nested or sparse (COO, CSR, "
                              "CSC, BSR, BSC). Keep such tensors on the CPU (e.g. "
                              ".cpu().to_mkldnn()), or keep them strided on flagos.");
}

}  // namespace

at::Tensor NativeViews::layout_view_of(const at::Tensor& flagos,
                                       std::vector<at::Tensor>& buffers) {
  if (flagos.is_nested()) return nested_view_of(flagos, buffers);
  return flagos.is_sparse() ? sparse_view_of(flagos) : compressed_view_of(flagos);
}

at::Tensor NativeViews::layout_to_flagos(const at::Tensor& native, c10::DeviceIndex device) {
  if (native.is_nested()) return nested_to_flagos(native, device);
  return native.is_sparse() ? sparse_to_flagos(native, device)
                            : compressed_to_flagos(native, device);
}

void release_storage_ref(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

c10::Storage native_storage_holding(c10::StorageImpl* flagos, c10::DeviceIndex index) {
  c10::raw::intrusive_ptr::incref(flagos);
  c10::DataPtr data(flagos->data_ptr().get(), flagos, &release_storage_ref,
                    NativeViews::native_device(index));
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), flagos->nbytes(), std::move(data),
      /*allocator=*/nullptr, /*resizable=*/false));
}

c10::Storage flagos_storage_holding(c10::StorageImpl* native, c10::DeviceIndex device) {
  c10::raw::intrusive_ptr::incref(native);
  c10::DataPtr ref(native->data_ptr().get(), native, &release_storage_ref,
                   c10::Device(kFlagos, device));
  return c10::Storage(runtime::make_flagos_storage(native->nbytes(), std::move(ref)));
}

// The calling thread's recent native views, so that a tensor used again (a
// weight, the result of the previous operator) does not get a new TensorImpl
// per call: building one is the largest remaining cost of a small operator.
// Set-associative by the flagos TensorImpl's address, four ways a set (one
// cache line), the least recently used way replaced: direct-mapped, one fresh
// result whose address shares a slot with a weight's would evict the weight
// on every other call; with two ways, an optimizer step over 311 parameters
// rebuilt 6% of its views every step, from sets that three of its tensors
// share. An entry is used only if it still describes the flagos tensor
// exactly: the same twin storage (a twin is never shared by two live flagos
// storages, and the entry keeps it alive, so its address cannot be reused),
// dtype, sizes, strides, offset and conj/neg/zero bits. A stale entry is therefore
// harmless; it holds one small TensorImpl and a twin that owns no memory.
class ViewCache {
 public:
  const at::Tensor* find(const c10::TensorImpl* flagos, const c10::StorageImpl* twin) {
    Set& set = sets_[set_of(flagos)];
    const int way = way_of(set, flagos);
    if (way < 0) return nullptr;
    // put() never stores an undefined view.
    if (!describes(set.way[way].native, flagos, twin)) return nullptr;
    to_front(set, way);
    return &set.way[0].native;
  }

  void put(const c10::TensorImpl* flagos, const at::Tensor& native) {
    Set& set = sets_[set_of(flagos)];
    const int found = way_of(set, flagos);
    const int way = found >= 0 ? found : kWays - 1;  // else the least recently used
    set.way[way].flagos = flagos;
    set.way[way].native = native;
    to_front(set, way);
  }

 private:
  // Enough for an optimizer's `_foreach_*` lists over every parameter (a few
  // thousand tensors) to stay cached between steps: 128 KiB a thread.
  static constexpr int kSetBits = 11;
  static constexpr int kWays = 4;
  static constexpr size_t kSets = size_t{1} << kSetBits;
  static size_t set_of(const void* p) {  // Fibonacci hashing of the address
    return (reinterpret_cast<uintptr_t>(p) * 0x9E3779B97F4A7C15ull) >> (64 - kSetBits);
  }
  struct Entry {
    const c10::TensorImpl* flagos = nullptr;
    at::Tensor native;
  };
  // Ways in order of use, the most recent first.
  struct alignas(64) Set {
    Entry way[kWays];
  };
  static_assert(sizeof(Set) == 64, "a set is one cache line");
  // The way holding `flagos`'s entry, or -1.
  static int way_of(const Set& set, const c10::TensorImpl* flagos) {
    for (int w = 0; w < kWays; ++w) {
      if (set.way[w].flagos == flagos) return w;
    }
    return -1;
  }
  static void to_front(Set& set, int way) {
    if (way > 0) std::rotate(set.way, set.way + way, set.way + way + 1);
  }
  std::array<Set, kSets> sets_;
};

namespace {
// The cache (128 KiB) lives on the heap, behind a trivially initialised
// thread-local pointer: the pointer needs no guard when read, and keeps the
// library's thread-local block small enough for the loader's static TLS space
// (CMakeLists.txt: TLS descriptors). The owner, touched once per thread,
// frees the cache, and the views it holds, when the thread ends.
thread_local ViewCache* t_view_cache = nullptr;

ViewCache* make_thread_view_cache() {
  struct Owner {
    std::unique_ptr<ViewCache> cache = std::make_unique<ViewCache>();
    ~Owner() { t_view_cache = nullptr; }
  };
  thread_local Owner owner;
  t_view_cache = owner.cache.get();
  return t_view_cache;
}

ViewCache* thread_view_cache() {
  ViewCache* cache = t_view_cache;
  return cache != nullptr ? cache : make_thread_view_cache();
}
}  // namespace

NativeViews::NativeViews(bool reuse_views) noexcept
    : cache_(reuse_views ? thread_view_cache() : nullptr) {}

// Decided by the driver, which is selected once per process before any
// tensor exists; read on every view, so computed once.
c10::DispatchKey NativeViews::native_key() {
  static const c10::DispatchKey key =
      runtime::driver().nativeDevice() == hal::NativeDevice::kHost ? c10::DispatchKey::CPU
                                                                    : c10::DispatchKey::CUDA;
  return key;
}

c10::DispatchKey NativeViews::native_key_like(c10::DispatchKey flagos) {
  return c10::toRuntimePerBackendFunctionalityKey(c10::toFunctionalityKey(flagos),
                                                  c10::toBackendComponent(native_key()));
}

c10::DeviceType NativeViews::native_type() {
  static const c10::DeviceType type = native_key() == c10::DispatchKey::CPU
                                          ? c10::DeviceType::CPU
                                          : c10::DeviceType::CUDA;
  return type;
}

c10::Device NativeViews::native_device(c10::DeviceIndex index) {
  const c10::DeviceType type = native_type();
  return type == c10::DeviceType::CPU ? c10::Device(type) : c10::Device(type, index);
}

at::Tensor native_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), NativeViews::native_key(), like);
}

at::Tensor flagos_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

const at::Tensor& NativeViews::view_of(const at::Tensor& flagos) {
  if (!flagos.defined()) return flagos;
  c10::TensorImpl* impl = flagos.unsafeGetTensorImpl();
  c10::StorageImpl* fs = impl->unsafe_storage().unsafeGetStorageImpl();
  // The storage's twin when it has a valid one (every storage flagos made):
  // nothing to record per storage, since every view of the storage shares the
  // twin. Views of twins outlive the call in the thread's cache, keyed by the
  // flagos tensor.
  c10::StorageImpl* ns = FlagosStorage::twin_of(fs);
  const bool twin = ns != nullptr;
  if (twin) {
    if (cache_ != nullptr) {
      // A routed result keeps its own view; other tensors' views are in the
      // thread's cache.
      const at::Tensor* kept = runtime::ResultTensorImpl::native_view_of(impl);
      if (kept == nullptr || !describes(*kept, impl, ns)) kept = cache_->find(impl, ns);
      if (kept != nullptr) {
        tensors_.push_back({*kept, impl, ns});
        return tensors_.back().native;
      }
    }
  } else {
    // Else a native storage for this call alone, shared by the call's views of
    // that storage (so that aliasing between arguments survives), not cached.
    OwnedStorage* owned = owned_of_flagos_.find(owned_, fs, owned_by_flagos);
    if (owned == nullptr) {
      owned_.push_back({fs, c10::Storage(runtime::make_native_twin(*fs))});
      owned = &owned_.back();
    }
    ns = owned->native.unsafeGetStorageImpl();
  }
  c10::Storage storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(ns));
  at::Tensor view =
      runtime::CopiedTensorImpl::copyable(*impl)
          ? at::Tensor(c10::make_intrusive<runtime::NativeViewImpl>(std::move(storage),
                                                                     native_key(), *impl))
          : tensor_on(std::move(storage), native_key(), flagos);
  tensors_.push_back({std::move(view), impl, ns});
  if (cache_ != nullptr && twin) cache_->put(impl, tensors_.back().native);
  return tensors_.back().native;
}

void NativeViews::sync_back(c10::TensorImpl* flagos, const at::Tensor& native_view) {
  c10::StorageImpl* ns = native_view.storage().unsafeGetStorageImpl();
  c10::StorageImpl* fs = flagos->storage().unsafeGetStorageImpl();
  // The kernel never sees the flagos storage, so it still holds the memory the
  // view started with: a view over other memory or of another size had its
  // storage grown by the kernel (not one it swapped in: that is no storage
  // of ours).
  if ((ns == FlagosStorage::attached_twin(fs) ||
       owned_of_native_.find(owned_, ns, owned_by_native) != nullptr) &&
      (ns->data_ptr().get() != fs->data_ptr().get() || ns->nbytes() != fs->nbytes())) {
    // The grown memory came from the flagos allocator (capturing scope), so
    // it moves over without a copy; the native storage keeps pointing at it,
    // owning nothing.
    const size_t nbytes = ns->nbytes();
    c10::DataPtr grown = runtime::take_memory(*ns, flagos->device());
    TORCH_INTERNAL_ASSERT(runtime::FlagosAllocator::owns(grown),
                          "grown storage was not allocated by flagos");
    runtime::replace_memory(*fs, std::move(grown), nbytes);
  }
  if (!same(flagos->sizes(), native_view.sizes()) ||
      !same(flagos->strides(), native_view.strides()) ||
      flagos->storage_offset() != native_view.storage_offset()) {
    flagos->set_sizes_and_strides(native_view.sizes(), native_view.strides(),
                                  native_view.storage_offset());
  }
  // A kernel may flip an out= tensor's conj or neg bit (linalg's solvers with
  // left=False write the conjugate of the result and set the bit).
  const c10::TensorImpl* n = native_view.unsafeGetTensorImpl();
  if ((n->key_set() & runtime::kFlagKeys) != (flagos->key_set() & runtime::kFlagKeys)) {
    flagos->_set_conj(n->is_conj());
    flagos->_set_neg(n->is_neg());
  }
}

void NativeViews::layout_sync_back(c10::TensorImpl* flagos, const at::Tensor& twin,
                                   c10::DeviceIndex device) {
  // A nested kernel writes into its output's buffer and keeps its metadata.
  if (flagos->is_sparse()) {
    sparse_sync_back(flagos, twin, device);
  } else if (flagos->is_sparse_compressed()) {
    compressed_sync_back(flagos, twin, device);
  }
}

at::Tensor NativeViews::component_to_flagos(const at::Tensor& native, const at::Tensor& flagos,
                                            c10::DeviceIndex device) {
  at::Tensor mapped = to_flagos(native, device);
  if (mapped.unsafeGetTensorImpl() == flagos.unsafeGetTensorImpl()) {
    sync_back(flagos.unsafeGetTensorImpl(), native);
  }
  return mapped;
}

at::Tensor NativeViews::to_flagos(const at::Tensor& native,
                                  c10::DeviceIndex device) {
  if (!native.defined() || native.device().type() == kFlagos) return native;
  // A sparse result (to_sparse(), to_sparse_csr()) maps its components; other
  // layouts (mkldnn) have no storage to adopt.
  if (C10_UNLIKELY(native.layout() != c10::kStrided)) {
    if (has_components(native)) return layout_to_flagos(native, device);
    refuse_layout(native);
  }
  c10::StorageImpl* ns = native.storage().unsafeGetStorageImpl();
  const c10::DataPtr& dp = ns->data_ptr();
  // Our views' storages (twins, owned_) never own memory: a result in memory
  // of the flagos allocator (a fresh one, nearly always) is none of them, and
  // needs neither lookup.
  const bool flagos_memory = runtime::FlagosAllocator::owns(dp);
  if (!flagos_memory) {
    if (TensorPair* t =
            tensor_of_native_.find(tensors_, native.unsafeGetTensorImpl(), tensor_by_native)) {
      return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(t->flagos));
    }
    if (TensorPair* t = tensor_of_native_storage_.find(tensors_, ns, tensor_by_native_storage)) {
      // A nested view of an argument's buffer (_nested_view_from_buffer, as
      // torch.load rebuilds nested tensors) has no strides to copy.
      if (C10_UNLIKELY(native.is_nested())) return nested_to_flagos(native, device);
      return flagos_tensor_on(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
                                  t->flagos->unsafe_storage().unsafeGetStorageImpl())),
                              native);
    }
  }
  if (auto* a = adopted_of_native_.find(adopted_, ns, adopted_by_native)) {
    return flagos_tensor_on(a->second, native);
  }
  if (native.device().type() != native_type()) {
    // A result on some third device type (e.g. a CPU scalar from a CUDA op):
    // returned as it is, as the native op would.
    return native;
  }
  // A nested result (the transformer fast path's _nested_tensor_from_mask):
  // adopting its buffer alone would lose its sizes.
  if (C10_UNLIKELY(native.is_nested())) return nested_to_flagos(native, device);
  // A flagos TensorImpl cannot carry a quantizer: adopting the memory would
  // hand back a tensor of a quantized dtype that is not quantized.
  TORCH_CHECK_NOT_IMPLEMENTED(!native.is_quantized(), "a kernel returned a quantized tensor (",
                              native.scalar_type(), "), but flagos tensors are not quantized. "
                              "Keep quantized tensors on the CPU, or dequantize them "
                              "(.dequantize()) before moving them to flagos.");
  const size_t nbytes = ns->nbytes();
  // Held by this result alone: then nothing else holds its version counter
  // either, so the flagos tensor may share it (ResultTensorImpl), and no other
  // result of the call can be on this storage.
  const bool sole_owner = flagos_memory && native.storage().use_count() == 1;
  if (sole_owner) {
    // Flagos memory already (the host driver's capturing scope, or the CUDA
    // caching allocator), held by this result alone: the allocation itself
    // moves to a flagos storage, so it frees (and record_stream works)
    // exactly as for any flagos tensor; the result's own storage stays
    // behind as the flagos storage's twin when it can serve as one. The
    // flagos tensor takes the kernel's metadata as it is
    // (runtime/result_tensor.h), and the kernel's own result, over the twin,
    // stays with it as its native view: the next operator that takes this
    // result (usually the very next one) uses it.
    const bool native_is_twin = runtime::usable_as_twin(*ns);
    c10::Storage storage(native_is_twin ? runtime::make_flagos_storage_over(ns, device)
                                        : runtime::make_flagos_storage(
                                              nbytes, runtime::take_memory(
                                                          *ns, c10::Device(kFlagos, device))));
    auto result = c10::make_intrusive<runtime::ResultTensorImpl>(std::move(storage),
                                                                 *native.unsafeGetTensorImpl());
    if (cache_ != nullptr && native_is_twin) result->keep_native_view(native);
    return at::Tensor(std::move(result));
  }
  c10::Storage flagos_storage;
  if (dp.get() == nullptr || flagos_memory) {
    // Flagos memory shared with other native tensors: the flagos storage
    // keeps the native one alive and frees through it.
    flagos_storage = flagos_storage_holding(ns, device);
  } else {
    // Memory from elsewhere (a kernel's cached constant, another allocator):
    // copied, so that every flagos storage is flagos memory.
    c10::Storage fresh(runtime::allocate_flagos_storage(device, nbytes));
    if (nbytes > 0) {
      runtime::driver().copy(fresh.mutable_data(), dp.get(), nbytes,
                             hal::CopyKind::kDeviceToDevice, nullptr, false);
    }
    flagos_storage = std::move(fresh);
  }
  adopted_.emplace_back(ns, flagos_storage);
  return flagos_tensor_on(std::move(flagos_storage), native);
}

}  // namespace torch_fl::aten
