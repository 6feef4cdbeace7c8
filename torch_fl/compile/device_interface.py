"""Dynamo's device interface for flagos (torch._dynamo.device_interface).

Dynamo and Inductor ask it for the current device and stream, for device
properties (Inductor sizes reductions and grids from them) and for
capabilities. Devices, streams and events are flagos's own; the properties are
those of the driver's native device, because that is the hardware the
generated kernels run on: the CPU on the host driver, the CUDA device of the
same ordinal on the cuda driver.
"""

import torch
from torch._dynamo.device_interface import (
    CpuInterface,
    DeviceInterface,
    caching_worker_current_devices,
    caching_worker_device_properties,
    register_interface_for_device,
)

from .. import _C, flagos
from ..flagos._device import _on_cuda


def _index(device) -> int:
    if device is None:
        return FlagosInterface.Worker.current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "flagos":
        raise ValueError(f"expected a flagos device, got {device}")
    return FlagosInterface.Worker.current_device() if device.index is None else device.index


class FlagosInterface(DeviceInterface):
    device = flagos.device
    Event = flagos.Event
    Stream = flagos.Stream

    class Worker:
        """Properties recorded in the main process, usable in compile workers."""

        @staticmethod
        def set_device(device: int) -> None:
            caching_worker_current_devices["flagos"] = device

        @staticmethod
        def current_device() -> int:
            if "flagos" in caching_worker_current_devices:
                return caching_worker_current_devices["flagos"]
            return flagos.current_device()

        @staticmethod
        def get_device_properties(device=None):
            if not _on_cuda():
                return CpuInterface.Worker.get_device_properties(device)
            if "flagos" not in caching_worker_device_properties:
                caching_worker_device_properties["flagos"] = [
                    torch.cuda.get_device_properties(i) for i in range(flagos.device_count())
                ]
            return caching_worker_device_properties["flagos"][_index(device)]

    current_device = staticmethod(flagos.current_device)
    set_device = staticmethod(flagos.set_device)
    device_count = staticmethod(flagos.device_count)
    stream = staticmethod(flagos.stream)
    current_stream = staticmethod(flagos.current_stream)
    set_stream = staticmethod(flagos.set_stream)
    synchronize = staticmethod(flagos.synchronize)
    memory_allocated = staticmethod(flagos.memory_allocated)

    @staticmethod
    def exchange_device(device: int) -> int:
        return _C._exchange_device(device)

    @staticmethod
    def maybe_exchange_device(device: int) -> int:
        return _C._exchange_device(device)

    @staticmethod
    def is_available() -> bool:
        return flagos.is_available()

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        # Only generated GPU code asks: on the cuda driver the flagos current
        # stream is the CUDA current stream. The host driver runs inline.
        if _on_cuda():
            return torch._C._cuda_getCurrentRawStream(device_idx)
        return 0

    @classmethod
    def get_device_properties(cls, device=None):
        return cls.Worker.get_device_properties(device)

    @staticmethod
    def get_compute_capability(device=None):
        if _on_cuda():
            major, minor = torch.cuda.get_device_capability(_index(device))
            return major * 10 + minor
        return ""

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        if _on_cuda():
            return torch.cuda.is_bf16_supported(including_emulation)
        return True

    @staticmethod
    def is_triton_capable(device=None) -> bool:
        # Triton runs on flagos through the cuda driver only; the host driver
        # compiles C++ (Inductor's CPU backend).
        return _on_cuda() and torch.cuda.get_device_properties(_index(device)).major >= 7

    @staticmethod
    def raise_if_triton_unavailable(device=None) -> None:
        if not _on_cuda():
            raise RuntimeError(
                f"Triton kernels need the cuda driver; this process runs flagos on the "
                f"'{_C._driver_name()}' driver, where Inductor generates C++ kernels"
            )
        import triton.backends

        if "nvidia" not in triton.backends.backends:
            raise RuntimeError("triton not built with the 'nvidia' backend")


def register() -> None:
    """Registers the interface for "flagos" and every "flagos:N" (idempotent)."""
    register_interface_for_device("flagos", FlagosInterface)
    for i in range(flagos.device_count()):
        register_interface_for_device(f"flagos:{i}", FlagosInterface)


register()
