"""torch.distributed.checkpoint saving flagos tensors in a process that also has CUDA.

DCP's file writer copies each tensor to the CPU before writing it. With one
writer thread and an accelerator present, it uses ``_OverlappingCpuLoader``,
which copies the tensors of *one* device type, the first available one
(``torch._utils._get_available_device_type``): ``cuda`` whenever CUDA is
available, so on the cuda driver flagos tensors reach the writer unmoved and
it fails with "Tensor must be on CPU". Without CUDA (the host driver) that
type is flagos and nothing needs doing.

The fix wraps the loader's data resolver so that a flagos tensor a loader of
another device type would leave alone comes back copied to the CPU. The copy
is blocking, which loses the overlap for flagos tensors only; CUDA tensors keep
PyTorch's path.
"""

import functools

import torch

from . import _import_hooks
from ._wrap import wrap_once

_MODULE = "torch.distributed.checkpoint.filesystem"


def _to_cpu_if_flagos(resolve_fun):
    @functools.wraps(resolve_fun)
    def resolve(obj):
        data = resolve_fun(obj)
        if isinstance(data, torch.Tensor) and data.device.type == "flagos":
            return data.detach().to("cpu")
        return data

    return resolve


def _patch_loader() -> None:
    import torch.distributed.checkpoint.filesystem as filesystem

    cls = getattr(filesystem, "_OverlappingCpuLoader", None)
    if cls is None:  # a torch that renamed it: say so (after_import warns)
        raise AttributeError(f"{_MODULE} has no _OverlappingCpuLoader")

    def wrap(original):
        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if getattr(self, "device_type", None) != "flagos" and hasattr(self, "resolve_fun"):
                self.resolve_fun = _to_cpu_if_flagos(self.resolve_fun)

        return __init__

    wrap_once(cls, "__init__", wrap)


def install() -> None:
    """Patches the loader once DCP's file writer is imported (never imports it itself)."""
    _import_hooks.after_import(
        _MODULE, _patch_loader,
        "torch.distributed.checkpoint cannot save flagos tensors while CUDA is available")
