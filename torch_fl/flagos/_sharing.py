"""flagos tensors and storages shared with other processes (torch.multiprocessing).

PyTorch shares a tensor between processes by pickling it with ``multiprocessing``'s
ForkingPickler, whose reducers (torch/multiprocessing/reductions.py) know CPU shared
memory and CUDA IPC. The reducers below wrap PyTorch's: anything not on flagos goes
to PyTorch's reducer unchanged. A flagos tensor or storage is sent as a native
tensor or storage over the same bytes (csrc/ipc/shared_memory.h), which PyTorch's
own reducer then sends, and the receiving process makes a flagos tensor over the
bytes it gets. Both processes use the same memory, as with CPU and CUDA tensors:

- cuda driver: a CUDA tensor over the flagos memory, sent by CUDA IPC (with its
  reference counting: the sender's memory stays allocated while a receiver uses it);
- host driver: the flagos storage moves, on its first trip, into a CPU shared-memory
  segment of the current sharing strategy, which it uses from then on.

Sending fails for what CUDA refuses too: a non-leaf tensor that requires grad, and
memory received by CUDA IPC. Where the caller pickles (``Process(args=...)``,
``SimpleQueue.put``, ``Pipe.send``) the error is raised there. A ``Queue`` pickles in
its feeder thread, where an error would only be printed and the receiver would wait
forever, so there the error travels as a marker that raises it in the receiving
process when it unpickles it (``q.get()``).
"""

import threading
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)

from .. import _C

_NON_LEAF = (
    "Cowardly refusing to serialize non-leaf flagos tensor which requires_grad, since "
    "autograd does not support crossing process boundaries. If you just want to transfer "
    "the data, call detach() on the tensor before serializing (e.g., putting it on the queue)."
)


def _host_driver() -> bool:
    return _C._driver_name() == "host"


def _bytes_of(storage) -> "torch.Tensor":
    """A flagos storage as a 1-D uint8 tensor over all of it (the same storage)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


# ---- the bytes of a storage: sent as PyTorch sends native memory ---------------

def _host_segment(t):
    """The CPU shared-memory segment `t`'s storage uses, moved into one if needed."""
    strategy = torch.multiprocessing.get_sharing_strategy()
    found = _C._ipc_host_segment(t)
    # A segment of another strategy would be copied by PyTorch's reducer into a new
    # one, away from the flagos storage: move the storage itself instead.
    if found is not None and found[1] == strategy:
        return found[0]
    segment = _bytes_of_cpu(torch.UntypedStorage._new_shared(t.untyped_storage().nbytes()))
    _C._ipc_host_move_into(t, segment, strategy)
    return segment


def _bytes_of_cpu(storage):
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _send_bytes(t):
    """(rebuild, args) for the whole storage of flagos tensor `t`."""
    index = t.device.index or 0
    if t.untyped_storage().nbytes() == 0:  # no memory to share (nor to map)
        return _empty_bytes, (index,)
    if _host_driver():
        segment = _host_segment(t)
        return _host_bytes, (segment.untyped_storage(), torch.multiprocessing.get_sharing_strategy(),
                             index)
    return _cuda_bytes, (_C._ipc_native_bytes(t),)


def _empty_bytes(index):
    return torch.empty(0, dtype=torch.uint8, device=torch.device("flagos", index))


def _host_bytes(storage, strategy, index):
    return _C._ipc_host_adopt(_bytes_of_cpu(storage), index, strategy)


def _cuda_bytes(native):
    # flagos device i is CUDA device i: the index PyTorch opened the memory on.
    return _C._ipc_flagos_bytes(native, native.device.index, True)


# ---- tensors and storages ------------------------------------------------------

def _reduce_tensor(t):
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(_NON_LEAF)
    torch.utils.hooks.warn_if_has_hooks(t)
    rebuild, args = _send_bytes(t)
    meta = (type(t), t.dtype, t.storage_offset(), tuple(t.size()), t.stride(),
            t.requires_grad, t.is_conj(), t.is_neg())
    return _rebuild_tensor, (rebuild, args) + meta


def _rebuild_tensor(rebuild, args, cls, dtype, offset, size, stride, requires_grad, conj, neg):
    data = rebuild(*args)
    t = torch.empty(0, dtype=dtype, device=data.device)
    t.set_(data.untyped_storage(), offset, size, stride)
    if conj:
        torch._C._set_conj(t, True)
    if neg:
        torch._C._set_neg(t, True)
    if cls is torch.nn.Parameter:
        # Through the constructor: integer tensors refuse requires_grad=True.
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def _reduce_storage(storage):
    return _rebuild_storage, _send_bytes(_bytes_of(storage))


def _rebuild_storage(rebuild, args):
    return rebuild(*args).untyped_storage()


# ---- installation --------------------------------------------------------------

def _refuse(message: str):
    """Runs in the receiving process, in place of the flagos object it never got."""
    raise RuntimeError(message)


def _in_queue_feeder() -> bool:
    # multiprocessing.queues.Queue names its feeder thread so.
    return threading.current_thread().name == "QueueFeederThread"


def _wrap(original, flagos_reduce, what: str):
    def reduce(obj):
        if obj.device.type != "flagos":
            return original(obj)
        try:
            return flagos_reduce(obj)
        except Exception as e:
            if _in_queue_feeder():
                return _refuse, (f"sending a flagos {what} failed in the sending process: {e}",)
            raise

    reduce.__qualname__ = f"reduce_flagos_aware_{what}"
    return reduce


def install() -> None:
    """Wraps PyTorch's ForkingPickler reducers for tensors and untyped storages (once).

    A TypedStorage needs no wrapper: PyTorch's reducer sends its untyped storage.
    """
    reducers = ForkingPickler._extra_reducers
    kinds = [(torch.Tensor, _reduce_tensor, "tensor"), (torch.nn.Parameter, _reduce_tensor, "tensor"),
             (torch.UntypedStorage, _reduce_storage, "storage")]
    for cls, flagos_reduce, what in kinds:
        original = reducers.get(cls)
        if original is None or getattr(original, "_flagos_wrapped", False):
            continue
        wrapped = _wrap(original, flagos_reduce, what)
        wrapped._flagos_wrapped = True
        ForkingPickler.register(cls, wrapped)
