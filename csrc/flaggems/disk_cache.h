#pragma once

// Compiled FlagGems kernels and autotuned configs on disk, so that the next
// process skips Triton's compilation, FlagGems' autotuning and the first-call
// capture: `$FLAGOS_CACHE_DIR/flaggems` (default `~/.cache/torch_fl/flaggems`),
// one file per entry named by a hash of its full key (the JIT function's
// source hash, the Triton version, the GPU arch and the kernel or tuner key),
// which the file repeats and a read compares. Writes are atomic (temporary
// file + rename); an unreadable or mismatching file is ignored.

#include <optional>
#include <string>
#include <string_view>

#include "flaggems/python_side.h"
#include "flaggems/registry.h"

namespace torch_fl::flaggems::disk {

// The directory in use; "" when the disk cache is off (unwritable).
std::string directory();

struct KernelEntry {
  KernelBinary binary;
  bool verified = false;
};

// `identity`: the full key of the entry (see kernel_identity / tuner_identity).
std::optional<KernelEntry> load_kernel(const std::string& identity);
void store_kernel(const std::string& identity, const KernelEntry& entry);
std::optional<TunedConfig> load_tuned(const std::string& identity);
void store_tuned(const std::string& identity, const TunedConfig& cfg);

std::string kernel_identity(const JitFn& fn, int arch, const abi::Key& key);
std::string tuner_identity(const JitFn& fn, int arch, const int64_t* key, int n);

}  // namespace torch_fl::flaggems::disk
