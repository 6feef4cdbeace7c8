"""Kernels for flagos tensors are generated as kernels of the driver's native device.

flagos memory is native memory (host memory on the host driver, CUDA memory on
the cuda driver), so the kernel Inductor would write for the native device is
already the right kernel. During kernel code generation Inductor reads the
*current device* to choose its language-level behaviour: which backend's dtype
rules apply, how a kernel is called from the wrapper, which device properties
Triton is handed. Setting the current device to the native one for exactly
that span makes Inductor generate and call the native kernel, while buffers,
allocations, extern kernels and fallbacks stay on flagos and go through
flagos routing.
"""

import contextlib
import functools

import torch
from torch._inductor.virtualized import V

from . import _compat


@contextlib.contextmanager
def _native_current_device(native_type: str, with_index: bool):
    graph = V.graph
    device = graph.current_device
    if device is None or device.type != "flagos":
        yield
        return
    native = torch.device(native_type, device.index) if with_index else torch.device(native_type)
    with graph.set_current_device(native):
        yield


def generate_for(native_type: str, with_index: bool):
    """Class decorator for a Scheduling subclass: its code generation runs as ``native_type``."""

    def decorate(cls):
        for name in _compat.codegen_entry_points(cls):
            method = getattr(cls, name)

            @functools.wraps(method)
            def run(self, *args, _method=method, **kwargs):
                with _native_current_device(native_type, with_index):
                    return _method(self, *args, **kwargs)

            setattr(cls, name, run)
        return cls

    return decorate


class CacheKeyPass(_compat.cache_key_pass_base()):
    """A post-grad pass that changes nothing; its uuid keeps cached code apart per driver.

    Inductor's FX graph cache keys on the graph, config and torch, not on what
    the flagos device is: without this, C++ code compiled under the host
    driver could be served to a cuda-driver process on the same machine.
    """

    def __init__(self, driver: str):
        self._uuid = ("torch_fl.compile", driver, _CODEGEN_VERSION)

    def __call__(self, gm) -> None:
        return None

    def uuid(self):
        return self._uuid


# Bump when what torch_fl generates changes, so stale cache entries are not reused.
_CODEGEN_VERSION = 5
