"""flagos tensors and storages shared with other processes (torch.multiprocessing).

PyTorch shares a tensor between processes by pickling it with ``multiprocessing``'s
ForkingPickler, whose reducers (torch/multiprocessing/reductions.py) know CPU shared
memory and CUDA IPC. The reducers below wrap PyTorch's: anything not on flagos goes
to PyTorch's reducer unchanged. A flagos tensor or storage is sent as native memory
over the same bytes (csrc/ipc/), and the receiving process makes a flagos tensor over
the bytes it gets. Both processes use the same memory, as with CPU and CUDA tensors:

- cuda driver: a CUDA tensor over the flagos memory, sent by PyTorch's CUDA reducer
  (CUDA IPC, with its reference counting: the memory stays allocated while a receiver
  uses it). A storage once sent cannot be resized (new memory would free the block
  receivers map), and memory received cannot be sent on, as with CUDA.
- host driver: the storage moves, on its first trip (or at ``share_memory_()``), into a
  CPU shared-memory segment of the current sharing strategy, and uses it from then on,
  unresizable, as CPU shared storages are.

The native memory is reduced here, at once, so that every error is raised where the
caller pickles (``Process(args=...)``, ``SimpleQueue.put``, ``Pipe.send``). A plain
``Queue`` pickles in its feeder thread, where an error would only be printed and the
receiver would wait forever; there the error travels as a marker that raises it in
the receiving process when it unpickles it (``q.get()``).
"""

import multiprocessing.context
import multiprocessing.queues
import multiprocessing.reduction
import os
import threading
import weakref
from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)
from torch.multiprocessing import reductions as _torch_reductions

from .. import _C
from .._wrap import wrap_once
from ._device import _on_cuda

_NON_LEAF = (
    "Cowardly refusing to serialize non-leaf flagos tensor which requires_grad, since "
    "autograd does not support crossing process boundaries. If you just want to transfer "
    "the data, call detach() on the tensor before serializing (e.g., putting it on the queue)."
)

# One storage moves into shared memory once, whichever thread sends it first.
_move_lock = threading.Lock()


def _bytes_of(storage):
    """A storage as a 1-D uint8 tensor over all of it (the same storage)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _describe(t) -> str:
    return f"flagos tensor of shape {tuple(t.shape)}, {t.dtype}, on {t.device}"


def _check_dense(t) -> None:
    # Before anything moves: a nested or sparse tensor has no storage to share.
    if t.layout != torch.strided or t.is_nested:
        raise RuntimeError(f"a {t.layout} {'nested ' if t.is_nested else ''}flagos tensor cannot "
                           "be shared with another process; send a dense tensor")


# ---- the host driver: shared-memory segments ----------------------------------

def _new_segment(nbytes: int, strategy: str):
    # The strategy read once for this send: _new_shared would read it again.
    if strategy == "file_system":
        return torch.UntypedStorage._new_using_filename_cpu(nbytes)
    return torch.UntypedStorage._new_using_fd_cpu(nbytes)


def _host_segment(t, strategy: str):
    """The segment `t`'s storage uses (a CPU UntypedStorage), moved into one if needed."""
    with _move_lock:
        found = _C._ipc_host_segment(t)
        # A segment of another strategy would be copied by PyTorch into a new one, away
        # from the flagos storage: the storage itself moves into one of this strategy.
        if found is not None and found[1] == strategy:
            return found[0].untyped_storage()
        segment = _new_segment(t.untyped_storage().nbytes(), strategy)
        _C._ipc_host_move_into(t, _bytes_of(segment), strategy)
        return segment


def _share_segment(segment, strategy: str):
    """PyTorch's CPU reducer for `segment`, run now under `strategy`: (rebuild, args)."""
    cache = _torch_reductions.shared_cache
    if strategy == "file_system":
        metadata = segment._share_filename_cpu_()
        segment._shared_incref()
        cache[metadata[1]] = _torch_reductions.StorageWeakRef(segment)
        return _torch_reductions.rebuild_storage_filename, (type(segment),) + metadata
    fd, size = segment._share_fd_cpu_()
    cache[_torch_reductions.fd_id(fd)] = _torch_reductions.StorageWeakRef(segment)
    return (_torch_reductions.rebuild_storage_fd,
            (type(segment), multiprocessing.reduction.DupFd(fd), size))


# ---- what is sent for the bytes of a storage ------------------------------------

class _Carrier:
    """One storage's reduction as an object, which pickle sends once per message.

    Arguments of a process being spawned travel in one message whose descriptors
    are listed once each, and a received descriptor is read once: two tensors over
    one storage must share one reduction there, as PyTorch's reducer gets by
    pickling one storage object once.
    """

    def __init__(self, rebuild, args):
        self.reduced = (rebuild, args)

    def __reduce__(self):
        return self.reduced


# The carriers of each process being spawned, by flagos storage.
_spawn_carriers = weakref.WeakKeyDictionary()


def _send_bytes(t):
    """(rebuild, args) that give the receiver the whole storage of flagos tensor `t`."""
    popen = multiprocessing.context.get_spawning_popen()
    if popen is None:
        return _received_storage, (_Carrier(*_reduce_bytes(t)),)
    carriers = _spawn_carriers.setdefault(popen, {})
    key = t.untyped_storage()._cdata  # alive while the arguments are pickled
    if key not in carriers:
        carriers[key] = _Carrier(*_reduce_bytes(t))
    return _received_storage, (carriers[key],)


def _received_storage(storage):
    return storage  # the carrier arrives rebuilt


def _reduce_bytes(t):
    index = t.device.index or 0
    if t.untyped_storage().nbytes() == 0:  # no memory to share (nor to map)
        return _empty_bytes, (index,)
    if not _on_cuda():
        strategy = torch.multiprocessing.get_sharing_strategy()
        shared = _share_segment(_host_segment(t, strategy), strategy)
        return _host_bytes, (shared, strategy, index)
    sent = _torch_reductions.reduce_tensor(_C._ipc_native_bytes_to_send(t))
    return _cuda_bytes, (sent, os.getpid(), _remember_sent(t.untyped_storage()))


def _empty_bytes(index):
    return torch.empty(0, dtype=torch.uint8, device=torch.device("flagos", index)).untyped_storage()


class _WeakStorages:
    """Storages by an integer key, held weakly; entries of storages gone are forgotten."""

    def __init__(self):
        self._refs = {}
        self._lock = threading.Lock()

    def get(self, key, still_valid=lambda storage: True):
        """The live storage under `key` if `still_valid`, else None."""
        with self._lock:
            return self._live(key, still_valid)

    def put(self, key, storage) -> None:
        with self._lock:
            self._keep(key, storage)

    def get_or_make(self, key, make, still_valid):
        """The live storage under `key` if `still_valid`, else `make()`'s, kept (one lock: one maker)."""
        with self._lock:
            storage = self._live(key, still_valid)
            if storage is None:
                storage = make()
                self._keep(key, storage)
            return storage

    def _live(self, key, still_valid):
        ref = self._refs.get(key)
        if ref is None or ref.expired():
            return None
        storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
        return storage if still_valid(storage) else None

    def _keep(self, key, storage) -> None:
        self._refs[key] = _torch_reductions.StorageWeakRef(storage)
        if len(self._refs) > 256:
            for k in [k for k, r in self._refs.items() if r.expired()]:
                del self._refs[k]


# The receiver's flagos storages by the native storage they use: two tensors over one
# storage arrive over one flagos storage (overlap checks, resizes), as PyTorch's own
# cache gives CUDA and CPU receivers one storage.
_received = _WeakStorages()


def _flagos_storage_for(native, make):
    return _received.get_or_make(
        native._cdata, lambda: make().untyped_storage(),
        lambda s: s.data_ptr() == native.data_ptr() and s.nbytes() == native.nbytes())


def _host_bytes(shared, strategy, index):
    rebuild, args = shared
    segment = rebuild(*args)
    return _flagos_storage_for(
        segment, lambda: _C._ipc_host_adopt(_bytes_of(segment), index, strategy))


# cuda driver: the storages this process sent, by a token that travels with them. A
# process cannot open its own CUDA IPC memory (a Pipe's two ends in one process): a
# storage that comes back is looked up here instead, as PyTorch's cache does for CUDA.
_sent = _WeakStorages()


def _remember_sent(storage) -> int:
    token = storage._cdata
    _sent.put(token, storage)
    return token


def _cuda_bytes(sent, pid, token):
    if pid == os.getpid():
        storage = _sent.get(token)
        if storage is not None:
            return storage
    rebuild, args = sent
    native = rebuild(*args)
    # flagos device i is CUDA device i: the device PyTorch opened the memory on.
    return _flagos_storage_for(native.untyped_storage(),
                               lambda: _C._ipc_flagos_bytes_received(native, native.device.index))


# ---- tensors and storages ------------------------------------------------------

def _reduce_tensor(t):
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError(_NON_LEAF)
    _check_dense(t)
    torch.utils.hooks.warn_if_has_hooks(t)
    meta = (type(t), t.dtype, t.storage_offset(), tuple(t.size()), t.stride(),
            t.requires_grad, t.is_conj(), t.is_neg())
    return (_rebuild_tensor, _send_bytes(t) + meta)


def _rebuild_tensor(rebuild, args, cls, dtype, offset, size, stride, requires_grad, conj, neg):
    storage = rebuild(*args)
    t = torch.empty(0, dtype=dtype, device=storage.device)
    t.set_(storage, offset, size, stride)
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
    return rebuild(*args)


# ---- share_memory_() and is_shared() ---------------------------------------------

def _wrap_share_memory(original):
    def share_memory_(self, *args, **kwargs):
        # PyTorch leaves PrivateUse1 storages alone (as CUDA's, which are shareable as
        # they are). Host-driver memory must move first: done now, a program can share
        # before it makes aliases of the memory (DLPack, NumPy), as on the CPU.
        if self.device.type == "flagos" and not _on_cuda() and self.nbytes() > 0:
            _host_segment(_bytes_of(self), torch.multiprocessing.get_sharing_strategy())
            return self
        return original(self, *args, **kwargs)

    return share_memory_


def _wrap_is_shared(original):
    def is_shared(self):
        if self.device.type == "flagos":
            # cuda driver: always shareable, as CUDA's storages are.
            return _on_cuda() or _C._ipc_host_segment(_bytes_of(self)) is not None
        return original(self)

    return is_shared


# ---- installation --------------------------------------------------------------

def _refuse(message: str):
    """Runs in the receiving process, in place of the flagos object it never got."""
    raise RuntimeError(message)


def _in_plain_queue_feeder() -> bool:
    """Whether a multiprocessing.Queue's own feeder thread is pickling.

    Other queues (concurrent.futures' process pools) handle a feeder's errors
    themselves, for the one item, so the error must reach them as it is.
    """
    thread = threading.current_thread()
    if thread.name != "QueueFeederThread":
        return False
    # Queue's handler is a staticmethod; a subclass's own is a bound method.
    default = multiprocessing.queues.Queue._on_queue_feeder_error
    for arg in getattr(thread, "_args", ()):
        if getattr(arg, "__name__", None) == "_on_queue_feeder_error":
            return getattr(arg, "__func__", arg) is default
    return False


def _wrap(original, flagos_reduce, what: str):
    def reduce(obj):
        if obj.device.type != "flagos":
            return original(obj)
        try:
            return flagos_reduce(obj)
        except Exception as e:
            if _in_plain_queue_feeder():
                culprit = _describe(obj) if isinstance(obj, torch.Tensor) else f"flagos {what}"
                return _refuse, (f"sending a {culprit} failed in the sending process: {e}",)
            raise

    reduce.__qualname__ = f"reduce_flagos_aware_{what}"
    return reduce


def install() -> None:
    """Wraps PyTorch's ForkingPickler reducers for tensors and untyped storages, and
    UntypedStorage's share_memory_ and is_shared (once).

    A TypedStorage needs no wrapper: PyTorch's reducer and methods go through its
    untyped storage.
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
    wrap_once(torch.UntypedStorage, "share_memory_", _wrap_share_memory)
    wrap_once(torch.UntypedStorage, "is_shared", _wrap_is_shared)
