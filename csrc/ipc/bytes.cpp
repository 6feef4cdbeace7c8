#include "ipc/bytes.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "aten/native_view.h"
#include "runtime/device.h"
#include "runtime/storage.h"

namespace torch_fl::ipc {

at::Tensor bytes_over(c10::Storage storage, c10::DispatchKey key) {
  const auto n = static_cast<int64_t>(storage.nbytes());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key),
                                                   caffe2::TypeMeta::Make<uint8_t>());
  impl->set_sizes_contiguous({n});
  return at::Tensor(std::move(impl));
}

void check_flagos(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.device().type() == runtime::kFlagos &&
                  t.layout() == c10::kStrided && !t.is_nested(),
              "torch_fl sharing: ", what, " must be a dense flagos tensor, got ",
              t.defined() ? t.toString() : std::string("an undefined tensor"));
}

void check_driver(bool host, const char* what) {
  const bool is_host = aten::NativeViews::native_type() == c10::DeviceType::CPU;
  TORCH_CHECK(is_host == host, "torch_fl sharing: ", what, " is for the ",
              host ? "host" : "cuda", " driver; this process runs the ",
              is_host ? "host" : "cuda", " driver");
}

void make_unresizable(c10::StorageImpl& storage) {
  storage.set_resizable(false);
  if (c10::StorageImpl* twin = runtime::FlagosStorage::attached_twin(&storage)) {
    twin->set_resizable(false);
  }
}

}  // namespace torch_fl::ipc
