#pragma once

// The host driver's autograd worker threads take the intra-op thread count of
// the thread that started the backward pass (intra_op_threads.cpp).

namespace torch_fl::runtime {

// As a backward pass starts (torch_fl/_autograd_threads.py): `threads` is the
// calling thread's torch.get_num_threads().
void note_backward_threads(int threads) noexcept;

// Before a flagos autograd node runs (the engine's stream guard): on one of
// the engine's worker threads, takes the noted count where it differs. Any
// other thread is left as it is.
void follow_backward_threads();

}  // namespace torch_fl::runtime
