#include "ipc/host_segments.h"

#include <cstring>

#include <ATen/MapAllocator.h>
#include <c10/core/StorageImpl.h>

#include "ipc/bytes.h"
#include "runtime/device.h"
#include "runtime/storage.h"

namespace torch_fl::ipc {
namespace {

constexpr const char* kFileDescriptor = "file_descriptor";
constexpr const char* kFileSystem = "file_system";

// What a flagos storage in a segment holds: the segment's CPU storage, which
// PyTorch's reducers send without copying as long as it is of the strategy
// they run under, and that strategy.
struct Segment {
  c10::Storage cpu;
  std::string strategy;
};

void release_segment(void* ctx) { delete static_cast<Segment*>(ctx); }

// A segment of the strategy it claims. PyTorch's reducer would copy any other
// memory into a new segment and swap the copy into the CPU storage, freeing
// the memory a flagos storage uses.
void check_segment(const at::Tensor& segment, const std::string& strategy) {
  TORCH_CHECK(segment.defined() && segment.device().is_cpu() &&
                  segment.scalar_type() == at::kByte && segment.dim() == 1 &&
                  segment.storage_offset() == 0 &&
                  static_cast<size_t>(segment.numel()) == segment.storage().nbytes(),
              "torch_fl sharing: a segment is a 1-D uint8 CPU tensor over a whole storage");
  TORCH_CHECK(strategy == kFileDescriptor || strategy == kFileSystem,
              "torch_fl sharing: unknown sharing strategy '", strategy, "' (valid: ",
              kFileDescriptor, ", ", kFileSystem, ")");
  // PyTorch makes shared memory unresizable; of the two kinds, only the
  // file-descriptor one is a MapAllocator that keeps its descriptor.
  const at::MapAllocator* map = at::MapAllocator::fromDataPtr(segment.storage().data_ptr());
  const bool fd_kind = map != nullptr && (map->flags() & at::ALLOCATOR_MAPPED_KEEPFD);
  TORCH_CHECK(!segment.storage().resizable() && fd_kind == (strategy == kFileDescriptor),
              "torch_fl sharing: the segment is no shared memory of strategy '", strategy, "'");
}

c10::DataPtr segment_data(const at::Tensor& segment, std::string strategy,
                          c10::DeviceIndex device) {
  auto* held = new Segment{segment.storage(), std::move(strategy)};
  return c10::DataPtr(held->cpu.mutable_data(), held, &release_segment,
                      c10::Device(runtime::kFlagos, device));
}

}  // namespace

std::optional<std::pair<at::Tensor, std::string>> host_segment(const at::Tensor& t) {
  check_driver(/*host=*/true, "a shared-memory segment");
  check_flagos(t, "the tensor to send");
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &release_segment) return std::nullopt;
  const auto* held = static_cast<const Segment*>(dp.get_context());
  TORCH_INTERNAL_ASSERT(held->cpu.data() == dp.get(), "a segment's memory moved under its storage");
  return std::make_pair(bytes_over(held->cpu, c10::DispatchKey::CPU), held->strategy);
}

void host_move_into(const at::Tensor& t, const at::Tensor& segment, std::string strategy) {
  check_driver(/*host=*/true, "moving into shared memory");
  check_flagos(t, "the tensor to send");
  c10::StorageImpl& fs = *t.storage().unsafeGetStorageImpl();
  const size_t nbytes = fs.nbytes();
  check_segment(segment, strategy);
  TORCH_CHECK(segment.storage().nbytes() == nbytes, "torch_fl sharing: a segment of ",
              segment.storage().nbytes(), " bytes for a storage of ", nbytes);
  const c10::DeviceIndex device = t.device().index();
  // Kernels queued on the device's streams may still write the old memory.
  runtime::driver().synchronizeDevice(device);
  if (nbytes > 0) std::memcpy(segment.storage().mutable_data(), fs.data(), nbytes);
  runtime::replace_memory(fs, segment_data(segment, std::move(strategy), device), nbytes);
  make_unresizable(fs);
}

at::Tensor host_adopt(const at::Tensor& segment, c10::DeviceIndex device, std::string strategy) {
  check_driver(/*host=*/true, "adopting shared memory");
  runtime::check_device_index(device);
  check_segment(segment, strategy);
  c10::Storage storage(runtime::make_flagos_storage(
      segment.storage().nbytes(), segment_data(segment, std::move(strategy), device)));
  make_unresizable(*storage.unsafeGetStorageImpl());
  return bytes_over(std::move(storage), c10::DispatchKey::PrivateUse1);
}

}  // namespace torch_fl::ipc
