"""DLPack device of flagos tensors.

PyTorch's C++ DLPack export labels a PrivateUse1 tensor's capsule with the
device type ``kDLExtDev``, and its import maps ``kDLExtDev`` back to
PrivateUse1, so capsules round-trip (``torch.utils.dlpack.to_dlpack`` and
``from_dlpack``). ``Tensor.__dlpack_device__``, which ``torch.from_dlpack`` and
other libraries ask first, recognises that device only under the name
"privateuse1" and raises ``Unknown device type flagos for Dlpack`` once the
backend is renamed. The wrapper below answers for flagos tensors what the
capsule says; every other tensor gets PyTorch's answer.
"""

import functools

import torch
from torch.overrides import has_torch_function_unary
from torch.utils.dlpack import DLDeviceType

from .._wrap import wrap_once


def _wrap(original):
    @functools.wraps(original)
    def __dlpack_device__(self):
        # A subclass with __torch_function__ goes through PyTorch's handling,
        # which calls back here with the handling disabled.
        if not has_torch_function_unary(self) and self.device.type == "flagos":
            return (DLDeviceType.kDLExtDev, self.device.index or 0)
        return original(self)

    return __dlpack_device__


def install() -> None:
    """Wraps ``torch.Tensor.__dlpack_device__`` (once)."""
    wrap_once(torch.Tensor, "__dlpack_device__", _wrap)
