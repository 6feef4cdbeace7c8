// PyTorch's autograd engine runs the nodes of an accelerator's tensors on a
// worker thread of that device ("pt_autograd_<device>"), CUDA's and flagos'
// alike. The thread takes its OpenMP thread count from the last
// torch.set_num_threads of any thread when it starts, and keeps it. On CUDA it
// only launches kernels; on the host driver it runs the CPU's kernels itself,
// so a thread count set elsewhere (a DataLoader's pin-memory thread sets 1 for
// itself) made flagos' backward run single-threaded while the CPU's, which runs
// on the calling thread, did not: large reductions then differed in the last
// bits. The worker now follows the count of the thread that called backward().

#include "runtime/intra_op_threads.h"

#include <atomic>
#include <string_view>

#include <ATen/Parallel.h>
#include <c10/util/thread_name.h>

namespace torch_fl::runtime {
namespace {

std::atomic<int> g_backward_threads{0};  // 0: no backward noted yet

bool on_autograd_worker() {
  // Named by Engine::thread_init; read once per thread (a system call).
  thread_local const bool worker = std::string_view(c10::getThreadName()).starts_with("pt_autograd_");
  return worker;
}

}  // namespace

void note_backward_threads(int threads) noexcept {
  g_backward_threads.store(threads, std::memory_order_relaxed);
}

void follow_backward_threads() {
  const int want = g_backward_threads.load(std::memory_order_relaxed);
  if (want <= 0 || !on_autograd_worker()) return;
  if (at::get_num_threads() != want) at::set_num_threads(want);
}

}  // namespace torch_fl::runtime
