#include "flaggems/cuda_launch.h"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include <c10/util/Exception.h>

#include "flaggems/triton_abi.h"

#ifdef FLAGOS_WITH_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "runtime/cuda_bridge.h"
#endif

namespace torch_fl::flaggems::cuda {
namespace {

std::atomic<int> g_arch_override{0};
std::atomic<int> g_sms_override{0};
std::atomic<bool> g_dry_run{false};
int g_dry_function = 0;  // the address stands for every "loaded" kernel

}  // namespace

void set_dry_run(bool on) { g_dry_run.store(on); }
bool dry_run() { return g_dry_run.load(std::memory_order_relaxed); }

void override_device(int arch, int sm_count) {
  g_arch_override.store(arch);
  g_sms_override.store(sm_count);
}

#ifdef FLAGOS_WITH_CUDA
namespace {

constexpr int kMaxDevices = 64;
std::array<std::atomic<int>, kMaxDevices> g_arch{};
std::array<std::atomic<int>, kMaxDevices> g_sms{};

// The driver functions, resolved once through the runtime.
struct Driver {
  bool ok = false;
  std::string error;
  decltype(&::cuModuleLoadData) module_load_data = nullptr;
  decltype(&::cuModuleGetFunction) module_get_function = nullptr;
  decltype(&::cuFuncGetAttribute) func_get_attribute = nullptr;
  decltype(&::cuFuncSetAttribute) func_set_attribute = nullptr;
  decltype(&::cuFuncSetCacheConfig) func_set_cache_config = nullptr;
  decltype(&::cuFuncGetParamInfo) func_get_param_info = nullptr;
  decltype(&::cuLaunchKernelEx) launch_kernel_ex = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuCtxGetCurrent) ctx_get_current = nullptr;
  decltype(&::cuCtxSetCurrent) ctx_set_current = nullptr;
  decltype(&::cuDevicePrimaryCtxRetain) primary_ctx_retain = nullptr;
  decltype(&::cuGetErrorString) get_error_string = nullptr;
};

template <typename F>
void resolve(Driver& d, const char* name, F* fn, unsigned version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || p == nullptr) {
    if (d.error.empty()) {
      d.error = std::string("the CUDA driver has no ") + name + " (version " +
                std::to_string(version) + ")";
    }
    return;
  }
  *fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    resolve(d, "cuModuleLoadData", &d.module_load_data, 12000);
    resolve(d, "cuModuleGetFunction", &d.module_get_function, 12000);
    resolve(d, "cuFuncGetAttribute", &d.func_get_attribute, 12000);
    resolve(d, "cuFuncSetAttribute", &d.func_set_attribute, 12000);
    resolve(d, "cuFuncSetCacheConfig", &d.func_set_cache_config, 12000);
    resolve(d, "cuFuncGetParamInfo", &d.func_get_param_info, 12040);
    resolve(d, "cuLaunchKernelEx", &d.launch_kernel_ex, 12000);
    resolve(d, "cuDeviceGetAttribute", &d.device_get_attribute, 12000);
    resolve(d, "cuCtxGetCurrent", &d.ctx_get_current, 12000);
    resolve(d, "cuCtxSetCurrent", &d.ctx_set_current, 12000);
    resolve(d, "cuDevicePrimaryCtxRetain", &d.primary_ctx_retain, 12000);
    resolve(d, "cuGetErrorString", &d.get_error_string, 12000);
    d.ok = d.error.empty();
    return d;
  }();
  return d;
}

const char* error_text(CUresult r) {
  const char* s = nullptr;
  if (driver().get_error_string) driver().get_error_string(r, &s);
  return s ? s : "unknown CUDA driver error";
}

// The primary context of each device: launches need it current on the
// calling thread (PyTorch's threads have it once they used the runtime; a
// fresh thread may not).
std::array<std::atomic<CUcontext>, kMaxDevices> g_ctx{};

CUcontext primary_context(int device) {
  CUcontext c = g_ctx[device].load(std::memory_order_acquire);
  if (c) return c;
  const Driver& d = driver();
  CUcontext ctx = nullptr;
  CUresult r = d.primary_ctx_retain(&ctx, static_cast<CUdevice>(device));
  TORCH_CHECK(r == CUDA_SUCCESS, "flagos: cannot retain the primary CUDA context of device ",
              device, ": ", error_text(r));
  g_ctx[device].store(ctx, std::memory_order_release);
  return ctx;
}

void make_current(int device) {
  CUcontext want = primary_context(device);
  CUcontext cur = nullptr;
  const Driver& d = driver();
  d.ctx_get_current(&cur);
  if (cur != want) {
    CUresult r = d.ctx_set_current(want);
    TORCH_CHECK(r == CUDA_SUCCESS, "flagos: cannot make device ", device,
                "'s CUDA context current: ", error_text(r));
  }
}

int device_attribute(int device, cudaDeviceAttr attr) {
  int v = 0;
  cudaError_t err = cudaDeviceGetAttribute(&v, attr, device);
  TORCH_CHECK(err == cudaSuccess, "flagos: cudaDeviceGetAttribute failed for device ", device,
              ": ", cudaGetErrorString(err));
  return v;
}

// The current stream of `device` (torch_fl's stream, which is PyTorch's CUDA one).
cudaStream_t current_stream(int device) {
  return static_cast<cudaStream_t>(
      torch_fl::runtime::cuda::current_stream_handle(static_cast<c10::DeviceIndex>(device)));
}

}  // namespace

bool available() { return dry_run() || driver().ok; }

int arch(int device) {
  if (int o = g_arch_override.load(std::memory_order_relaxed)) return o;
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "flagos: device ", device, " out of range");
  int a = g_arch[device].load(std::memory_order_relaxed);
  if (a) return a;
  a = device_attribute(device, cudaDevAttrComputeCapabilityMajor) * 10 +
      device_attribute(device, cudaDevAttrComputeCapabilityMinor);
  g_arch[device].store(a, std::memory_order_relaxed);
  return a;
}

int sm_count(int device) {
  if (int o = g_sms_override.load(std::memory_order_relaxed)) return o;
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "flagos: device ", device, " out of range");
  int s = g_sms[device].load(std::memory_order_relaxed);
  if (s) return s;
  s = device_attribute(device, cudaDevAttrMultiProcessorCount);
  g_sms[device].store(s, std::memory_order_relaxed);
  return s;
}

bool load(int device, const std::string& cubin, const std::string& name, uint32_t shared,
          int num_warps, const uint8_t* sizes, int count, Loaded* out, std::string* error) {
  if (dry_run()) {
    out->function = &g_dry_function;
    return true;
  }
  const Driver& d = driver();
  if (!d.ok) {
    *error = d.error;
    return false;
  }
  make_current(device);
  CUmodule mod = nullptr;
  CUresult r = d.module_load_data(&mod, cubin.data());
  if (r != CUDA_SUCCESS) {
    *error = std::string("cuModuleLoadData: ") + error_text(r);
    return false;
  }
  CUfunction fn = nullptr;
  r = d.module_get_function(&fn, mod, name.c_str());
  if (r != CUDA_SUCCESS) {
    *error = "cuModuleGetFunction(" + name + "): " + error_text(r);
    return false;
  }
  // As Triton's load_binary: dynamic shared memory beyond 48 KiB needs opting in.
  int max_threads = 0;
  d.func_get_attribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn);
  if (num_warps * 32 > max_threads) {
    *error = "needs " + std::to_string(num_warps * 32) + " threads, the kernel allows " +
             std::to_string(max_threads);
    return false;
  }
  if (shared > 49152) {
    int optin = 0, static_shared = 0;
    d.device_get_attribute(&optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                           static_cast<CUdevice>(device));
    d.func_get_attribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn);
    if (static_cast<int>(shared) > optin) {
      *error = "needs " + std::to_string(shared) + " bytes of shared memory, the device has " +
               std::to_string(optin);
      return false;
    }
    d.func_set_cache_config(fn, CU_FUNC_CACHE_PREFER_SHARED);
    r = d.func_set_attribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             optin - static_shared);
    if (r != CUDA_SUCCESS) {
      *error = std::string("cuFuncSetAttribute: ") + error_text(r);
      return false;
    }
  }
  // The parameter list Triton compiled must be the one pack() fills.
  for (int i = 0;; ++i) {
    size_t offset = 0, size = 0;
    r = d.func_get_param_info(fn, static_cast<size_t>(i), &offset, &size);
    if (r == CUDA_ERROR_INVALID_VALUE) {
      if (i != count) {
        *error = "the kernel has " + std::to_string(i) + " parameters, the Triton " +
                 std::string(abi::kTritonVersion) + " packing gives " + std::to_string(count);
        return false;
      }
      break;
    }
    if (r != CUDA_SUCCESS) {
      *error = std::string("cuFuncGetParamInfo: ") + error_text(r);
      return false;
    }
    if (i >= count || size != sizes[i]) {
      *error = "parameter " + std::to_string(i) + " has " + std::to_string(size) +
               " bytes, the Triton packing gives " +
               (i < count ? std::to_string(sizes[i]) : std::string("none"));
      return false;
    }
  }
  out->function = fn;
  return true;
}

const char* launch(int device, void* function, const uint32_t grid[3], int num_warps,
                   uint32_t shared, void** params) {
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0 || dry_run()) return nullptr;
  const Driver& d = driver();
  make_current(device);
  CUlaunchConfig config{};
  config.gridDimX = grid[0];
  config.gridDimY = grid[1];
  config.gridDimZ = grid[2];
  config.blockDimX = 32 * static_cast<unsigned>(num_warps);
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = shared;
  config.hStream = current_stream(device);
  config.attrs = nullptr;
  config.numAttrs = 0;
  CUresult r = d.launch_kernel_ex(&config, static_cast<CUfunction>(function), params, nullptr);
  return r == CUDA_SUCCESS ? nullptr : error_text(r);
}

void memset_zero(int device, void* ptr, size_t nbytes) {
  if (nbytes == 0) return;
  cudaError_t err = cudaMemsetAsync(ptr, 0, nbytes, current_stream(device));
  TORCH_CHECK(err == cudaSuccess, "flagos: cudaMemsetAsync failed: ", cudaGetErrorString(err));
}

#else  // !FLAGOS_WITH_CUDA

bool available() { return dry_run(); }
int arch(int) { return g_arch_override.load(); }
int sm_count(int) { return g_sms_override.load(); }
bool load(int, const std::string&, const std::string&, uint32_t, int, const uint8_t*, int,
          Loaded* out, std::string* error) {
  if (dry_run()) {
    out->function = &g_dry_function;
    return true;
  }
  *error = "this torch_fl was built without CUDA";
  return false;
}
const char* launch(int, void*, const uint32_t*, int, uint32_t, void**) {
  return dry_run() ? nullptr : "this torch_fl was built without CUDA";
}
void memset_zero(int, void*, size_t) { TORCH_CHECK(false, "flagos: built without CUDA"); }

#endif  // FLAGOS_WITH_CUDA

}  // namespace torch_fl::flaggems::cuda
