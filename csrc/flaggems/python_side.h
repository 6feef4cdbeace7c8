#pragma once

// What the C++ launcher asks of Python, never on the hot path: libtorch_fl has
// no Python dependency, so the binding (csrc/python/flaggems.cpp) installs an
// implementation that calls torch_fl/_flaggems_cpp.py under the GIL.
//  - export: a FlagGems JIT function's parameters and source hash, once per
//    function (per rank for FlagGems' generated pointwise kernels);
//  - capture: the launches FlagGems' own Python wrapper made during one call
//    (Triton's launch hook), to verify a plan against and take the kernel from;
//  - compile: triton.compile of a planned specialization (stub-only mode).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flaggems/triton_abi.h"

namespace torch_fl::flaggems {

struct ExportedFn {
  int id = -1;             // Python's index for the function; -1: not exported
  std::string error;       // why not
  std::string cache_key;   // JITFunction.cache_key: source and dependencies
  std::vector<std::string> names;
  std::vector<abi::ParamInfo> params;
};

// A FlagGems PointwiseDynamicFunction, as its generated wrappers use it.
struct PointwiseInfo {
  std::string error;
  std::vector<bool> is_tensor;          // per positional argument
  // torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND (kOther: not served).
  enum class Method : uint8_t { kDefault, kNoOpmath, kIntToFloat, kAlwaysBool, kBoolToLong, kOther };
  struct Promotion {
    std::vector<int> args;              // positional arguments promoted together
    Method method;
  };
  std::vector<Promotion> promotions;    // one per output
  int max_tile = 0;                     // tile budget, after FlagGems' complex-dtype halving
  int max_grid0 = 0;
  bool block_pointer = true;            // CodeGenConfig.prefer_block_pointer
  bool tile_1d = false;                 // CodeGenConfig.prefer_1d_tile
};

struct CapturedArg {
  abi::Value value;
  bool supported = true;    // false: a value kind C++ does not model (text in `repr`)
  std::string repr;
  // Triton's own specialization of the argument (its binder), as text.
  std::string spec_type;    // "*fp32", "i32", "constexpr"
  abi::Attr spec_attr = abi::Attr::kNone;
};

struct KernelBinary {
  std::string name;
  std::string hash;         // Triton's metadata.hash
  std::string cubin;
  uint32_t shared = 0;
  int num_warps = 0, num_stages = 0, num_ctas = 1;
  int64_t global_scratch = 0, profile_scratch = 0;
  bool cooperative = false, pdl = false, tensor_descriptors = false;
  // Sizes of the PTX entry's parameters when known (offline checks).
  std::vector<int> entry_sizes;
};

struct CapturedLaunch {
  int fn_id = -1;           // -1: a Triton kernel no description exported
  uint32_t grid[3] = {1, 1, 1};
  KernelBinary binary;
  std::vector<CapturedArg> args;  // in parameter order
};

struct Capture {
  std::string error;
  int total = 0;            // every Triton launch seen on this thread
  std::vector<CapturedLaunch> launches;
};

// One planned launch, for compile().
struct CompileRequest {
  int fn_id = -1;
  std::vector<abi::Spec> specs;
  std::vector<abi::Value> values;  // constexpr values (others ignored)
  int num_warps = 4, num_stages = 3;
};

class PythonSide {
 public:
  virtual ~PythonSide() = default;
  // Runs `f` holding the GIL: every slow path runs under it, which also
  // serialises slow paths without a lock of their own (a C++ lock taken
  // before the GIL could deadlock against a thread that holds the GIL).
  virtual void with_gil(const std::function<void()>& f) = 0;
  // `ref`: "module:qualname", or "module:name@rank" for a pointwise function's
  // generated rank-N kernel.
  virtual ExportedFn export_fn(const std::string& ref) = 0;
  virtual PointwiseInfo pointwise(const std::string& ref) = 0;
  virtual void capture_begin() = 0;
  virtual Capture capture_end() = 0;
  virtual KernelBinary compile(const CompileRequest& request, std::string* error) = 0;
};

// Installed by the binding; null until then (and on builds without Python).
void set_python_side(PythonSide* side);
PythonSide* python_side();

}  // namespace torch_fl::flaggems
