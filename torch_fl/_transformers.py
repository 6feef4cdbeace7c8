"""Hugging Face ``Trainer``: the device of ``TrainingArguments`` agrees with accelerate's.

``Trainer`` places the model through accelerate, which takes the machine's
accelerator from ``torch.accelerator`` (flagos once torch_fl is loaded on a
torch without CUDA), and moves each batch to ``TrainingArguments.device``,
which transformers picks from a fixed list of device types and otherwise sets
to the CPU (``_setup_devices``). The model then sat on flagos and the batches
on the CPU, and the first step failed ("Expected all tensors to be on the same
device"), even in a CPU-only program with autoload. Where transformers fell
back to the CPU unasked (``use_cpu`` not set) and accelerate's device is
flagos, ``TrainingArguments.device`` is accelerate's, as transformers does for
the devices it knows (``xpu:0``, ``npu:0``). ``use_cpu=True`` keeps both on the
CPU.
"""

import functools

import torch

from . import _import_hooks
from ._wrap import wrap_once

_MODULE = "transformers.training_args"


def _agreeing_with_accelerate(original):
    setup = original.func

    @functools.wraps(setup)
    def _setup_devices(self):
        device = setup(self)
        state = getattr(self, "distributed_state", None)
        accelerate_device = getattr(state, "device", None)
        if (device.type == "cpu" and not self.use_cpu and accelerate_device is not None
                and accelerate_device.type == "flagos"):
            index = accelerate_device.index
            device = torch.device("flagos", torch.flagos.current_device() if index is None else index)
            torch.flagos.set_device(device)
        return device

    # Set on the class after its body ran, so the name is given here.
    prop = functools.cached_property(_setup_devices)
    prop.__set_name__(None, original.attrname)
    return prop


def _patch_training_arguments() -> None:
    from transformers.training_args import TrainingArguments

    original = TrainingArguments.__dict__.get("_setup_devices")
    if not isinstance(original, functools.cached_property):
        # A transformers that changed how it picks the device: say so (after_import warns).
        raise AttributeError(f"{_MODULE}.TrainingArguments._setup_devices is no cached_property")
    wrap_once(TrainingArguments, "_setup_devices", _agreeing_with_accelerate)


def install() -> None:
    _import_hooks.after_import(
        _MODULE, _patch_training_arguments,
        "Trainer may put the model on flagos and its batches on the CPU (use_cpu=True keeps "
        "both on the CPU)",
    )
