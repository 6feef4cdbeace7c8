"""Streams and events: thin subclasses of torch.Stream / torch.Event bound to flagos."""

import torch

from .. import _C
from ._device import _device_index, _index_or_current, _on_cuda, current_device

_CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, as torch.Stream's device_type takes it

_FLAGOS_DEVICE_TYPE = None


def _torch_device(device) -> torch.device:
    index = _device_index(device)
    return torch.device("flagos", current_device() if index < 0 else index)


class Stream(torch.Stream):
    """A flagos stream. ``priority`` < 0 asks for a high-priority stream."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # torch.Stream(stream_id=..., device_index=..., device_type=...)
            return super().__new__(cls, **kwargs)
        if torch.compiler.is_compiling() and _on_cuda():
            # What Dynamo can trace: a torch.Stream of the device, the same stream
            # (compile/dynamo_rules.py says why the host driver is left out).
            return torch.Stream(device=torch.device("flagos", _index_or_current(device)),
                                priority=priority)
        return super().__new__(cls, device=_torch_device(device), priority=priority)

    @property
    def priority(self) -> int:
        """The stream's priority: lower is higher, as ``torch.cuda.Stream.priority``."""
        if _on_cuda():  # the cuda driver's streams are CUDA's
            return torch.cuda.Stream(stream_id=self.stream_id, device_index=self.device_index,
                                     device_type=_CUDA_DEVICE_TYPE).priority
        return _C._stream_priority(self.stream_id)

    @staticmethod
    def priority_range() -> tuple:
        """(least, greatest) priority a stream can have, as ``torch.cuda.Stream.priority_range()``."""
        if _on_cuda():
            return torch.cuda.Stream.priority_range()
        return tuple(_C._stream_priority_range())


class Event:
    """A flagos event: ``torch.flagos.Event(enable_timing=True)``.

    Returns a plain ``torch.Event`` on the current flagos device (PyTorch's
    ``elapsed_time`` accepts only that exact type, not subclasses).
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return torch.Event(
            device=torch.device("flagos", current_device()),
            enable_timing=enable_timing, blocking=blocking, interprocess=interprocess,
        )


def current_stream(device=None) -> Stream:
    if (torch.compiler.is_compiling() and _on_cuda()
            and (device is None or _index_or_current(device) == current_device())):
        # Dynamo cannot trace the conversion below (nor the device checks): it
        # knows torch.accelerator's, which gives the same stream as a torch.Stream
        # (compile/dynamo_rules.py says why the host driver is left out). Only for
        # the current device: Dynamo answers that for any device it is given.
        return torch.accelerator.current_stream()
    s = torch.accelerator.current_stream(_torch_device(device))
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def default_stream(device=None) -> Stream:
    dev = _torch_device(device)
    return Stream(stream_id=0, device_index=dev.index, device_type=_device_type())


def _device_type() -> int:
    # torch.Stream's constructor takes the c10 DeviceType as an int.
    global _FLAGOS_DEVICE_TYPE
    if _FLAGOS_DEVICE_TYPE is None:
        _FLAGOS_DEVICE_TYPE = torch.accelerator.current_stream(
            torch.device("flagos", current_device())).device_type
    return _FLAGOS_DEVICE_TYPE


def set_stream(stream: torch.Stream) -> None:
    if stream is None:
        return
    if stream.device.type != "flagos":
        raise ValueError(f"expected a flagos stream, got one on {stream.device}")
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current (and its device, like torch.cuda.stream) inside a with block."""

    def __init__(self, stream):
        self.stream = stream
        self._prev_stream = None
        self._prev_device = -1

    def __enter__(self):
        if self.stream is None:
            return self
        if not isinstance(self.stream, torch.Stream) or self.stream.device.type != "flagos":
            raise ValueError(f"torch.flagos.stream expects a flagos stream, got {self.stream!r}")
        self._prev_device = current_device()
        self._prev_stream = current_stream(self.stream.device)
        set_stream(self.stream)
        return self

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        set_stream(self._prev_stream)
        from .. import _C
        _C._set_device(self._prev_device)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)
