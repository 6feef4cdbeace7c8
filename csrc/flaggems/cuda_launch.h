#pragma once

// The CUDA driver calls of the C++ launch path: loading a Triton cubin,
// checking its parameter list, and cuLaunchKernelEx on a stream. Entry points
// come from the CUDA runtime torch already loaded (cudaGetDriverEntryPoint-
// ByVersion), so libtorch_fl does not link libcuda. Without CUDA in the build
// every function reports "unavailable" (planning still works: offline tests).

#include <cstdint>
#include <string>

namespace torch_fl::flaggems::cuda {

// True when this build has CUDA and the driver entry points resolved (or in
// dry-run mode).
bool available();

// Test-only dry run (scripts/flaggems_offline_check.py --online): loads and
// launches succeed without a GPU and do nothing, so the whole online flow
// (routing, capture, admission, disk cache, hot path) runs on the host driver.
void set_dry_run(bool on);
bool dry_run();

// Compute capability (major * 10 + minor) and SM count of a device; for
// builds or tests without a GPU, override() sets what planners see.
int arch(int device);
int sm_count(int device);
void override_device(int arch, int sm_count);

// A loaded kernel: its CUfunction (the CUmodule stays loaded for the process).
struct Loaded {
  void* function = nullptr;
};

// Loads `cubin` into the current context of `device`, finds kernel `name`,
// sets the shared-memory attribute Triton sets, and checks that the kernel's
// parameters are exactly `count` with sizes `sizes` (cuFuncGetParamInfo).
// False with *error set otherwise.
bool load(int device, const std::string& cubin, const std::string& name, uint32_t shared,
          int num_warps, const uint8_t* sizes, int count, Loaded* out, std::string* error);

// Enqueues the kernel on the current stream of `device`. Returns a CUDA error
// string on failure, nullptr on success.
const char* launch(int device, void* function, const uint32_t grid[3], int num_warps,
                   uint32_t shared, void** params);

// Zero-fills `nbytes` at `ptr` on the current stream of `device`.
void memset_zero(int device, void* ptr, size_t nbytes);

}  // namespace torch_fl::flaggems::cuda
