#include "ipc/native_memory.h"

#include <c10/core/StorageImpl.h>

#include "aten/native_view.h"
#include "ipc/bytes.h"
#include "runtime/device.h"

namespace torch_fl::ipc {

at::Tensor native_bytes_to_send(const at::Tensor& t) {
  check_driver(/*host=*/false, "sending CUDA memory");
  check_flagos(t, "the tensor to send");
  c10::StorageImpl* fs = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(!fs->received_cuda(), "a flagos tensor (", t.sizes(), ", ", t.dtype(), ", ", t.device(),
              ") received from another process cannot be sent to another process again: CUDA "
              "IPC memory can be opened by one process only. Send a copy (tensor.clone()) instead.");
  make_unresizable(*fs);
  return bytes_over(aten::native_storage_holding(fs, t.device().index()),
                    aten::NativeViews::native_key());
}

at::Tensor flagos_bytes_received(const at::Tensor& native, c10::DeviceIndex device) {
  check_driver(/*host=*/false, "receiving CUDA memory");
  TORCH_CHECK(native.defined() && native.device().is_cuda(),
              "torch_fl sharing: expected a received CUDA tensor, got ",
              native.defined() ? native.toString() : std::string("an undefined tensor"));
  runtime::check_device_index(device);
  c10::Storage storage =
      aten::flagos_storage_holding(native.storage().unsafeGetStorageImpl(), device);
  storage.unsafeGetStorageImpl()->set_received_cuda(true);
  make_unresizable(*storage.unsafeGetStorageImpl());
  return bytes_over(std::move(storage), c10::DispatchKey::PrivateUse1);
}

}  // namespace torch_fl::ipc
