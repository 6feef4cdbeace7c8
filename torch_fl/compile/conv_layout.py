"""The memory format FakeTensors give a flagos convolution's result: the native device's.

FakeTensor's convolution (``torch/_subclasses/fake_impls.py``) predicts the
layout of a convolution's outputs from the backend PyTorch would select,
``torch._C._select_conv_backend``, and that backend's layout rule,
``torch._C._conv_determine_backend_memory_format``. For a PrivateUse1 tensor
the backend is ``Overrideable``, whose rule answers "contiguous". flagos'
convolution (csrc/aten/overrideable_ops.cpp) runs the native device's
convolution, though, and that keeps channels_last: a channels_last input or
weight gives a channels_last output on the CPU (oneDNN, slow2d) and on CUDA
(cuDNN). Compiled code then asserted the contiguous strides on a channels_last
result (Inductor's freezing and layout optimisation make weights channels_last)
and failed, and compiled channels_last models paid copies to contiguous.

The wrappers below ask both of PyTorch's functions, for flagos tensors, with
stand-ins of the native device type that have the flagos tensors' sizes,
strides and dtypes (FakeTensors: no memory): the backend the native device
would select, and that backend's layout rule, some of which answer only for
the native device type (slow2d's channels_last needs CPU tensors). FakeTensors
then follow the kernel that runs. Any other tensor gets PyTorch's answer.
"""

import functools

import torch

from .._wrap import wrap_once
from ..flagos._device import _on_cuda

def _native_device(t: torch.Tensor) -> torch.device:
    # flagos device N is CUDA device N on the cuda driver.
    return torch.device("cuda", t.device.index or 0) if _on_cuda() else torch.device("cpu")


def _stand_in(t, mode, device):
    if not isinstance(t, torch.Tensor) or t.device.type != "flagos":
        return t
    with mode:
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)


def _wrap(fn):
    @functools.wraps(fn)
    def on_native_stand_ins(*args, **kwargs):
        tensors = list(args[:2]) + [kwargs.get("input"), kwargs.get("weight")]
        first = next((t for t in tensors if isinstance(t, torch.Tensor)), None)
        if first is None or first.device.type != "flagos":
            return fn(*args, **kwargs)
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        mode = first.fake_mode if isinstance(first, FakeTensor) else FakeTensorMode()
        device = _native_device(first)
        args = tuple(_stand_in(a, mode, device) for a in args)
        kwargs = {k: _stand_in(v, mode, device) for k, v in kwargs.items()}
        return fn(*args, **kwargs)

    return on_native_stand_ins


def install_now() -> None:
    """Wraps ``torch._C._select_conv_backend`` and its layout rule (once each)."""
    for name in ("_select_conv_backend", "_conv_determine_backend_memory_format"):
        wrap_once(torch._C, name, _wrap)
