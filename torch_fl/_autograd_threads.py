"""The host driver's autograd worker threads: the caller's intra-op thread count.

PyTorch's autograd engine runs flagos nodes on a worker thread of the device,
as it does CUDA's, and that thread keeps the OpenMP thread count that was last
set by any thread when it started. On the host driver it runs the CPU's
kernels, so a count set by another thread (a DataLoader's pin-memory thread
sets 1) made flagos' backward differ from the CPU's, which runs on the calling
thread. Each backward pass started from Python notes the calling thread's
count; the worker takes it before each node (csrc/runtime/intra_op_threads.cpp).
"""

import functools

import torch

from . import _C
from ._wrap import wrap_once


def _noting_threads(original):
    @functools.wraps(original)
    def _engine_run_backward(*args, **kwargs):
        _C._note_backward_threads(torch.get_num_threads())
        return original(*args, **kwargs)

    return _engine_run_backward


def install() -> None:
    """On the host driver only: on the cuda driver the worker launches kernels."""
    if _C._driver_name() != "host":
        return
    import torch.autograd
    import torch.autograd.graph

    # torch.autograd imports the function by name; both are the same object.
    for owner in (torch.autograd.graph, torch.autograd):
        if callable(getattr(owner, "_engine_run_backward", None)):
            wrap_once(owner, "_engine_run_backward", _noting_threads)
