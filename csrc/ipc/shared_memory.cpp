#include "ipc/shared_memory.h"

#include <cstring>

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "aten/native_view.h"
#include "runtime/device.h"
#include "runtime/storage.h"

namespace torch_fl::ipc {
namespace {

using runtime::kFlagos;

bool host_driver() { return aten::NativeViews::native_type() == c10::DeviceType::CPU; }

// A 1-D uint8 tensor over all of `storage`, dispatching to `key`.
at::Tensor bytes_over(c10::Storage storage, c10::DispatchKey key) {
  const auto n = static_cast<int64_t>(storage.nbytes());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   caffe2::TypeMeta::Make<uint8_t>());
  impl->set_sizes_contiguous({n});
  return at::Tensor(std::move(impl));
}

void check_flagos(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.device().type() == kFlagos && t.layout() == c10::kStrided,
              "torch_fl sharing: ", what, " must be a strided flagos tensor, got ",
              t.defined() ? t.toString() : std::string("an undefined tensor"));
}

void check_host_driver(const char* what) {
  TORCH_CHECK(host_driver(), "torch_fl sharing: ", what,
              " is for the host driver; this process runs the ",
              aten::NativeViews::native_type(), " driver");
}

void check_segment(const at::Tensor& segment, size_t nbytes) {
  TORCH_CHECK(segment.defined() && segment.device().is_cpu() &&
                  segment.scalar_type() == at::kByte && segment.dim() == 1 &&
                  segment.storage_offset() == 0 &&
                  static_cast<size_t>(segment.numel()) == segment.storage().nbytes(),
              "torch_fl sharing: a segment is a 1-D uint8 CPU tensor over a whole storage");
  TORCH_CHECK(segment.storage().nbytes() == nbytes, "torch_fl sharing: a segment of ",
              segment.storage().nbytes(), " bytes for a storage of ", nbytes);
}

// What a flagos storage in a shared-memory segment holds: the segment's CPU
// storage (PyTorch's MapAllocator memory, which PyTorch's reducers send
// without copying) and the strategy it was made for.
struct Segment {
  c10::Storage cpu;
  std::string strategy;
};

void release_segment(void* ctx) { delete static_cast<Segment*>(ctx); }

c10::DataPtr segment_data(const at::Tensor& segment, std::string strategy,
                          c10::DeviceIndex device) {
  auto* held = new Segment{segment.storage(), std::move(strategy)};
  return c10::DataPtr(held->cpu.mutable_data(), held, &release_segment,
                      c10::Device(kFlagos, device));
}

}  // namespace

at::Tensor native_bytes(const at::Tensor& t) {
  check_flagos(t, "the tensor to send");
  c10::StorageImpl* fs = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(!fs->received_cuda(),
              "a flagos tensor received from another process cannot be sent to another process "
              "again: CUDA IPC memory can be opened by one process only. Send a copy "
              "(tensor.clone()) instead.");
  return bytes_over(aten::native_storage_holding(fs, t.device().index()),
                    aten::NativeViews::native_key());
}

at::Tensor flagos_bytes(const at::Tensor& native, c10::DeviceIndex device, bool received) {
  TORCH_CHECK(native.defined() && native.device().type() == aten::NativeViews::native_type(),
              "torch_fl sharing: expected a ", aten::NativeViews::native_type(),
              " tensor to adopt, got ",
              native.defined() ? native.toString() : std::string("an undefined tensor"));
  runtime::check_device_index(device);
  c10::Storage storage =
      aten::flagos_storage_holding(native.storage().unsafeGetStorageImpl(), device);
  storage.unsafeGetStorageImpl()->set_received_cuda(received);
  return bytes_over(std::move(storage), c10::DispatchKey::PrivateUse1);
}

std::optional<std::pair<at::Tensor, std::string>> host_segment(const at::Tensor& t) {
  check_host_driver("host_segment");
  check_flagos(t, "the tensor to send");
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &release_segment) return std::nullopt;
  const auto* held = static_cast<const Segment*>(dp.get_context());
  return std::make_pair(bytes_over(held->cpu, c10::DispatchKey::CPU), held->strategy);
}

void host_move_into(const at::Tensor& t, const at::Tensor& segment, std::string strategy) {
  check_host_driver("host_move_into");
  check_flagos(t, "the tensor to send");
  c10::StorageImpl& fs = *t.storage().unsafeGetStorageImpl();
  const size_t nbytes = fs.nbytes();
  check_segment(segment, nbytes);
  const c10::DeviceIndex device = t.device().index();
  // Kernels queued on the device's streams may still write the old memory.
  runtime::driver().synchronizeDevice(device);
  if (nbytes > 0) std::memcpy(segment.storage().mutable_data(), fs.data(), nbytes);
  runtime::replace_memory(fs, segment_data(segment, std::move(strategy), device), nbytes);
}

at::Tensor host_adopt(const at::Tensor& segment, c10::DeviceIndex device, std::string strategy) {
  check_host_driver("host_adopt");
  runtime::check_device_index(device);
  const size_t nbytes = segment.defined() ? segment.storage().nbytes() : 0;
  check_segment(segment, nbytes);
  return bytes_over(c10::Storage(runtime::make_flagos_storage(
                        nbytes, segment_data(segment, std::move(strategy), device))),
                    c10::DispatchKey::PrivateUse1);
}

}  // namespace torch_fl::ipc
