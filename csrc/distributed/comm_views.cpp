#include "distributed/comm_views.h"

#include <ostream>

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>

#include "aten/native_view.h"
#include "runtime/device.h"

namespace torch_fl::distributed {
namespace {

// "what", "what[i]" or "what[i][j]": built only for an error message.
struct ArgName {
  std::string_view what;
  int64_t i = -1, j = -1;
};
std::ostream& operator<<(std::ostream& os, const ArgName& n) {
  os << n.what;
  if (n.i >= 0) os << "[" << n.i << "]";
  if (n.j >= 0) os << "[" << n.j << "]";
  return os;
}

}  // namespace

void CommViews::check(const at::Tensor& t, std::string_view what_, int64_t i, int64_t j) {
  const ArgName what{what_, i, j};
  TORCH_CHECK_VALUE(t.defined(), "flagos backend: ", op_, " got an undefined tensor as ",
                    what);
  TORCH_CHECK_VALUE(
      t.device().type() == runtime::kFlagos, "flagos backend: ", op_, " got ", what,
      " on ", t.device(),
      "; a collective on the flagos backend takes flagos tensors only (the process "
      "group sends CPU tensors to its gloo backend, so do not mix devices in one call)");
  TORCH_CHECK_VALUE(t.layout() == c10::kStrided, "flagos backend: ", op_, " got ", what,
                    " with layout ", t.layout(), "; only dense (strided) tensors are supported");
  if (!device_) {
    device_ = t.device();
  } else {
    TORCH_CHECK_VALUE(*device_ == t.device(), "flagos backend: ", op_, " got ", what,
                      " on ", t.device(), " while its other tensors are on ", *device_,
                      "; one collective runs on one flagos device");
  }
}

at::Tensor CommViews::view(const at::Tensor& flagos, std::string_view what) {
  return view_at(flagos, what, -1, -1);
}

at::Tensor CommViews::view_at(const at::Tensor& flagos, std::string_view what, int64_t i,
                              int64_t j) {
  check(flagos, what, i, j);
  c10::StorageImpl* fs = flagos.storage().unsafeGetStorageImpl();
  c10::Storage* native = nullptr;
  for (auto& [f, n] : storages_) {
    if (f == fs) {
      native = &n;
      break;
    }
  }
  if (native == nullptr) {
    storages_.emplace_back(fs, aten::native_storage_holding(fs, flagos.device().index()));
    native = &storages_.back().second;
  }
  return aten::native_tensor_on(*native, flagos);
}

std::vector<at::Tensor> CommViews::view(const std::vector<at::Tensor>& flagos,
                                        std::string_view what) {
  std::vector<at::Tensor> out;
  out.reserve(flagos.size());
  for (size_t i = 0; i < flagos.size(); ++i) {
    out.push_back(view_at(flagos[i], what, static_cast<int64_t>(i), -1));
  }
  return out;
}

std::vector<std::vector<at::Tensor>> CommViews::view(
    const std::vector<std::vector<at::Tensor>>& flagos, std::string_view what) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(flagos.size());
  for (size_t i = 0; i < flagos.size(); ++i) {
    auto& row = out.emplace_back();
    row.reserve(flagos[i].size());
    for (size_t j = 0; j < flagos[i].size(); ++j) {
      row.push_back(view_at(flagos[i][j], what, static_cast<int64_t>(i), static_cast<int64_t>(j)));
    }
  }
  return out;
}

}  // namespace torch_fl::distributed
