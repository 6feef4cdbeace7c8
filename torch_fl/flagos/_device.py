"""Device selection: indices, the current device, the device context."""

import torch

from .. import _C


def _device_index(device, optional: bool = True) -> int:
    """Normalises ``device`` to an index; -1 means "current" (if optional).

    Accepts None, an int, "flagos", "flagos:N", a torch.device of type
    flagos or a torch.flagos.device. Anything else raises with the accepted forms.
    """
    if device is None:
        if optional:
            return -1
        raise ValueError("a flagos device is required (an int, 'flagos:N' or torch.device)")
    if isinstance(device, bool):
        raise TypeError(f"a flagos device must be an int, str or torch.device, not {device!r}")
    if isinstance(device, int):
        index = device
    elif isinstance(device, _DeviceContext):
        # a torch.flagos.device context object stands for its device, as
        # torch.cuda's _get_device_index takes a torch.cuda.device
        index = device.idx
    else:
        if isinstance(device, str):
            try:
                device = torch.device(device)
            except RuntimeError as e:
                raise ValueError(
                    f"{device!r} is not a device: use 'flagos' or 'flagos:N'"
                ) from e
        if not isinstance(device, torch.device):
            raise TypeError(
                f"a flagos device must be an int, str or torch.device, not {type(device).__name__}"
            )
        if device.type != "flagos":
            raise ValueError(f"expected a flagos device, got {device}")
        if device.index is None:
            return -1 if optional else current_device()
        index = device.index
    if index < 0:
        if optional and index == -1:
            return -1
        raise RuntimeError(f"flagos device index {index} is negative")
    count = device_count()
    if index >= count:
        raise RuntimeError(
            f"The device index is out of range: flagos device index {index} does not exist; "
            f"this process has {count} flagos device(s), valid indices are 0..{count - 1}"
        )
    return index


def _index_or_current(device) -> int:
    """_device_index with "no index" (None, 'flagos', -1) resolved to the current device."""
    index = _device_index(device)
    return current_device() if index == -1 else index


_driver_name = None  # the driver's name, once asked: it never changes in a process


def _on_cuda() -> bool:
    """Whether the cuda driver runs this process: flagos device i is then CUDA device i."""
    # A Python global, so that compiled code (Dynamo) can read it after the first call.
    global _driver_name
    if _driver_name is None:
        _driver_name = _C._driver_name()
    return _driver_name == "cuda"


def is_available() -> bool:
    """True when at least one flagos device can be used."""
    return _C._device_count() > 0


def device_count() -> int:
    return _C._device_count()


def get_device_name(device=None) -> str:
    """The device's name: on the cuda driver the GPU's, as torch.cuda names it."""
    index = _index_or_current(device)
    if _on_cuda():
        return torch.cuda.get_device_name(index)
    return "flagos host device (CPU memory and kernels)"


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether bfloat16 runs natively (as torch.cuda.is_bf16_supported); the CPU's
    kernels of the host driver always take it."""
    if _on_cuda():
        return torch.cuda.is_bf16_supported(including_emulation)
    return True


class FlagosDeviceProperties:
    """What the host driver can say about one of its devices, where
    torch.cuda.get_device_properties gives a GPU's: its name, the memory it can
    use (the machine's RAM, as mem_get_info reports it), and as
    ``multi_processor_count`` the CPU threads its kernels run on (what code
    written for CUDA, such as DataParallel's balance check, compares)."""

    __slots__ = ("name", "total_memory", "multi_processor_count")

    def __init__(self, name: str, total_memory: int, multi_processor_count: int):
        self.name = name
        self.total_memory = total_memory
        self.multi_processor_count = multi_processor_count

    def __repr__(self) -> str:
        return (f"FlagosDeviceProperties(name='{self.name}', "
                f"total_memory={self.total_memory // (1024 * 1024)}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def get_device_properties(device=None):
    """The device's properties: on the cuda driver torch.cuda's for the same GPU
    (name, total_memory, major/minor, multi_processor_count, ...); on the host
    driver a FlagosDeviceProperties."""
    index = _index_or_current(device)
    if _on_cuda():
        return torch.cuda.get_device_properties(index)
    return FlagosDeviceProperties(get_device_name(index), _C._mem_get_info(index)[1],
                                  torch.get_num_threads())


def get_device_capability(device=None) -> tuple:
    """(major, minor) compute capability: the GPU's on the cuda driver. The
    host driver's CPU kernels have none; torch.accelerator.get_device_capability
    lists the dtypes every driver supports."""
    index = _index_or_current(device)
    if _on_cuda():
        return torch.cuda.get_device_capability(index)
    raise RuntimeError(
        "the flagos host driver runs CPU kernels and has no compute capability; "
        "torch.accelerator.get_device_capability('flagos') lists its supported dtypes")


def can_device_access_peer(device, peer_device) -> bool:
    """Whether ``device`` can read another device's memory directly: the GPUs'
    answer on the cuda driver; on the host driver every device's memory is
    host memory, so any other device can. A device is not its own peer (as
    CUDA answers)."""
    index = _device_index(device, optional=False)
    peer = _device_index(peer_device, optional=False)
    if _on_cuda():
        return torch.cuda.can_device_access_peer(index, peer)
    return index != peer


# Inside torch.compile, Dynamo cannot trace torch_fl's extension module: a call
# of it breaks the graph (an error under fullgraph=True). There current_device
# and synchronize ask torch.accelerator's C++ functions, which Dynamo traces;
# they answer for the process's accelerator, whose current device is flagos'
# own on both drivers (on the cuda driver flagos device N is CUDA device N).


def current_device() -> int:
    if torch.compiler.is_compiling():
        return torch.accelerator.current_device_index()
    return _C._current_device()


def set_device(device) -> None:
    index = _device_index(device)
    if index >= 0:
        _C._set_device(index)


def synchronize(device=None) -> None:
    """Waits for all work on every stream of ``device`` (default: current)."""
    if torch.compiler.is_compiling():
        # Always a device with its index: Dynamo compiles a bare synchronize()
        # as one of device 0, not of the current device (a guarded constant).
        if device is None:
            device = torch.device("flagos", torch.accelerator.current_device_index())
        return torch.accelerator.synchronize(device)
    _C._synchronize(_device_index(device))


_SYNC_DEBUG_MODES = {"default": 0, "warn": 1, "error": 2}
_host_sync_debug_mode = 0


def set_sync_debug_mode(debug_mode) -> None:
    """Warns (``"warn"``, 1) or raises (``"error"``, 2) on operations that wait for the device,
    as ``torch.cuda.set_sync_debug_mode``; ``"default"`` (0) turns that off.

    On the cuda driver flagos work runs CUDA's kernels on CUDA's streams, so this is CUDA's own
    setting. The host driver runs every operation to its end as it is called: nothing ever waits
    for the device there, so no operation warns or raises; the mode is kept for
    ``get_sync_debug_mode``.
    """
    global _host_sync_debug_mode
    if isinstance(debug_mode, str):
        mode = _SYNC_DEBUG_MODES.get(debug_mode)
    elif isinstance(debug_mode, int) and not isinstance(debug_mode, bool):
        mode = debug_mode if debug_mode in _SYNC_DEBUG_MODES.values() else None
    else:
        mode = None
    if mode is None:
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}, expected one of "
                           "'default' (0), 'warn' (1), 'error' (2)")
    if _on_cuda():
        torch.cuda.set_sync_debug_mode(mode)
    else:
        _host_sync_debug_mode = mode


def get_sync_debug_mode() -> int:
    """The mode ``set_sync_debug_mode`` set: 0 (default), 1 (warn) or 2 (error)."""
    return torch.cuda.get_sync_debug_mode() if _on_cuda() else _host_sync_debug_mode


class device:
    """Context manager that makes ``device`` current and restores the previous one."""

    def __init__(self, device):
        self.idx = _device_index(device)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C._exchange_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx >= 0:
            _C._set_device(self.prev_idx)
        return False


_DeviceContext = device  # the parameter named `device` hides the class in _device_index


class device_of(device):
    """Makes the device of tensor ``obj`` current (no-op for non-flagos tensors)."""

    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "flagos" else -1)


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def is_initialized() -> bool:
    """True once this process has used the device (as torch.cuda.is_initialized)."""
    return _C._is_initialized() and not _is_in_bad_fork()


def _lazy_init() -> None:
    """Initialises the device, as torch.cuda._lazy_init does; raises in a child
    forked from a process that had initialised it."""
    _C._init()
    _C._lazy_init()


def init() -> None:
    """Initialises flagos (torch.cuda.init's counterpart)."""
    _lazy_init()
