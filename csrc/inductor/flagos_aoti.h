#pragma once

// Included by the C++ that Inductor writes for flagos graphs (cpp_wrapper and
// AOTInductor), after the native device's own header: the flagos C shims, and
// what the generated AOTInductor model needs to run as a flagos model.

#include <cstdint>
#include <string>

#include "c_shim_flagos.h"

extern "C" {
// The current flagos device index (libtorch_fl_aoti.so).
AOTI_TORCH_EXPORT AOTITorchError aoti_torch_flagos_current_device(int32_t* device_index);
}

namespace torch_fl::aoti {

// AOTInductor's model base accepts only PyTorch's own device names. A flagos
// model is built as one of its native device ("cpu" on the host driver, "cuda"
// on the cuda driver: the same memory and kernels) and then relabelled flagos.
// "flagos[:N]" -> "<native>[:N]".
inline std::string native_device_str(const std::string& device_str, const char* native_type) {
  const auto colon = device_str.find(':');
  std::string native = native_type;
  // The host driver's native device is the one CPU: its index stays flagos'.
  if (colon != std::string::npos && native != "cpu") {
    native += device_str.substr(colon);
  }
  return native;
}

// The flagos device index of "flagos[:N]": N, or the current device.
inline int32_t device_index(const std::string& device_str) {
  const auto colon = device_str.find(':');
  if (colon != std::string::npos) {
    return static_cast<int32_t>(std::stoi(device_str.substr(colon + 1)));
  }
  int32_t index = 0;
  AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_flagos_current_device(&index));
  return index;
}

}  // namespace torch_fl::aoti
