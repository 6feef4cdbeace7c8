"""flagos tensors and torch.multiprocessing: a clear error instead of a hang.

PyTorch shares a tensor between processes by pickling it with
``multiprocessing``'s ForkingPickler, whose reducers (torch/multiprocessing/
reductions.py) know CPU shared memory and CUDA IPC only. A flagos tensor gets
the CPU path and fails in ``_share_fd_cpu_``. Where the pickling runs in the
caller (``Process(args=...)``, ``SimpleQueue.put``, ``Pipe.send``) that error
reaches the user, but a ``Queue`` pickles in its feeder thread: the error is
printed there, nothing is sent, and the receiving process waits forever.

The reducers below wrap PyTorch's: anything not on flagos goes to PyTorch's
reducer unchanged. A flagos tensor or storage raises at once where the caller
pickles; in a queue's feeder thread it is sent as a marker that raises the same
error in the receiving process when it unpickles it (``q.get()``), so neither
side hangs.
"""

import threading
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)

_MESSAGE = (
    "a flagos {what} cannot be shared with another process through torch.multiprocessing: "
    "PyTorch {version} shares only CPU and CUDA memory between processes. Send {what}.cpu() "
    "instead (or torch.save it) and move it to flagos in the receiving process."
)


def _message(what: str) -> str:
    return _MESSAGE.format(what=what, version=torch.__version__)


def _refuse(message: str):
    """Runs in the receiving process, in place of the flagos object it never got."""
    raise RuntimeError(message)


def _in_queue_feeder() -> bool:
    # multiprocessing.queues.Queue names its feeder thread so.
    return threading.current_thread().name == "QueueFeederThread"


def _wrap(original, what: str):
    def reduce(obj):
        # A TypedStorage's own .device warns that TypedStorage is deprecated.
        if getattr(obj, "_untyped_storage", obj).device.type != "flagos":
            return original(obj)
        message = _message(what)
        if _in_queue_feeder():
            return _refuse, (message,)
        raise RuntimeError(message)

    reduce.__qualname__ = f"reduce_flagos_aware_{what}"
    return reduce


def install() -> None:
    """Wraps PyTorch's ForkingPickler reducers for tensors and storages (once)."""
    reducers = ForkingPickler._extra_reducers
    kinds = [(torch.Tensor, "tensor"), (torch.nn.Parameter, "tensor"),
             (torch.UntypedStorage, "storage"), (torch.storage.TypedStorage, "storage")]
    for cls, what in kinds:
        original = reducers.get(cls)
        if original is None or getattr(original, "_flagos_wrapped", False):
            continue
        wrapped = _wrap(original, what)
        wrapped._flagos_wrapped = True
        ForkingPickler.register(cls, wrapped)
