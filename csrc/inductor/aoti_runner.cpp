// AOTInductor packages compiled for flagos: the runner that
// torch._inductor.aoti_load_package (AOTIModelPackageLoader) looks up by the
// package's device name, and the one C function the generated model calls
// besides the C shims.

#include <map>
#include <mutex>
#include <utility>

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include "inductor/flagos_aoti.h"
#include "runtime/cuda_bridge.h"
#include "runtime/device.h"

namespace torch_fl::aoti {
namespace {

c10::Device flagos_device(const std::string& device_str) {
  const c10::Device device(device_str);
  TORCH_CHECK(device.type() == runtime::kFlagos, "the flagos AOTInductor runner was asked for device '",
              device_str, "'; it runs packages compiled for flagos only");
  return c10::Device(runtime::kFlagos, runtime::resolve_device(device.index()));  // no index: the current one
}

// The container's calls that make weight tensors (at::from_blob, which places
// memory it cannot attribute by the current device) or run constant folding
// are not virtual in the runner. Each such entry point of the model library is
// replaced by one that sets the model's device around the original, found by
// (container, slot).
using ContainerHandle = AOTInductorModelContainerHandle;

struct GuardedEntry {
  c10::Device device;
  void* original;
};

std::mutex& guarded_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::pair<ContainerHandle, int>, GuardedEntry>& guarded_entries() {
  static auto* entries = new std::map<std::pair<ContainerHandle, int>, GuardedEntry>();
  return *entries;
}

template <int Slot, typename... Args>
AOTIRuntimeError guarded_entry(ContainerHandle container, Args... args) {
  GuardedEntry entry{c10::Device(runtime::kFlagos), nullptr};
  {
    std::lock_guard<std::mutex> lock(guarded_mutex());
    entry = guarded_entries().at({container, Slot});
  }
  c10::DeviceGuard guard(entry.device);
  return reinterpret_cast<AOTIRuntimeError (*)(ContainerHandle, Args...)>(entry.original)(container, args...);
}

class FlagosModelRunner final : public torch::inductor::AOTIModelContainerRunner {
 public:
  FlagosModelRunner(const std::string& model_so_path, size_t num_models, const c10::Device device,
                    const std::string& cubin_dir, bool run_single_threaded)
      : AOTIModelContainerRunner(model_so_path, num_models, device.str(), cubin_dir, run_single_threaded),
        device_(device) {
    guard_entries(*this);
  }

  ~FlagosModelRunner() override {
    std::lock_guard<std::mutex> lock(guarded_mutex());
    auto& entries = guarded_entries();
    for (auto it = entries.begin(); it != entries.end();) {
      it = it->first.first == container_handle_ ? entries.erase(it) : std::next(it);
    }
  }

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles, void* stream_handle) override {
    c10::DeviceGuard guard(device_);
    // As CUDA's runner: without a stream, the model runs on the current one
    // (flagos' current stream is CUDA's on this driver).
    if (stream_handle == nullptr && runtime::uses_cuda()) {
      stream_handle = runtime::cuda::current_stream_handle(device_.index());
    }
    return AOTIModelContainerRunner::run_impl(input_handles, stream_handle);
  }

 private:
  template <int Slot, typename... Args>
  void guard_entry(AOTIRuntimeError (*&entry)(ContainerHandle, Args...)) {
    if (entry == nullptr) {
      return;
    }
    {
      std::lock_guard<std::mutex> lock(guarded_mutex());
      guarded_entries().insert_or_assign({container_handle_, Slot},
                                         GuardedEntry{device_, reinterpret_cast<void*>(entry)});
    }
    entry = &guarded_entry<Slot, Args...>;
  }

  // A template, so that an entry point this torch's runner does not have is
  // skipped rather than a compile error (the set grows with torch versions).
  template <typename Self>
  void guard_entries(Self& self) {
    if constexpr (requires { self.template guard_entry<0>(self.update_constant_buffer_func_); }) {
      guard_entry<0>(self.update_constant_buffer_func_);
    }
    if constexpr (requires { self.template guard_entry<1>(self.update_inactive_constant_buffer_func_); }) {
      guard_entry<1>(self.update_inactive_constant_buffer_func_);
    }
    if constexpr (requires { self.template guard_entry<2>(self.update_user_managed_constant_buffer_func_); }) {
      guard_entry<2>(self.update_user_managed_constant_buffer_func_);
    }
    if constexpr (requires { self.template guard_entry<3>(self.update_constant_buffer_from_cpu_func_); }) {
      guard_entry<3>(self.update_constant_buffer_from_cpu_func_);
    }
    if constexpr (requires { self.template guard_entry<4>(self.run_const_fold_func_); }) {
      guard_entry<4>(self.run_const_fold_func_);
    }
    if constexpr (requires { self.template guard_entry<5>(self.update_constants_from_blob_func_); }) {
      guard_entry<5>(self.update_constants_from_blob_func_);
    }
  }

  c10::Device device_;
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_runner(
    const std::string& model_so_path, size_t num_models, const std::string& device_str,
    const std::string& cubin_dir, const bool run_single_threaded) {
  const c10::Device device = flagos_device(device_str);
  // The model loads its weights as it is constructed, through at::from_blob,
  // which takes the device of memory it cannot place from the current device.
  c10::DeviceGuard guard(device);
  return std::make_unique<FlagosModelRunner>(model_so_path, num_models, device, cubin_dir,
                                             run_single_threaded);
}

const torch::inductor::RegisterAOTIModelRunner register_runner("flagos", &create_runner);

}  // namespace
}  // namespace torch_fl::aoti

extern "C" AOTITorchError aoti_torch_flagos_current_device(int32_t* device_index) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *device_index = torch_fl::runtime::current_device();
  });
}
