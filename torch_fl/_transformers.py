"""Hugging Face on flagos where transformers lists device types by name.

1. ``Trainer``: the device of ``TrainingArguments`` agrees with accelerate's.
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

``bf16=True`` is accepted where flagos runs bfloat16. ``TrainingArguments``
asks ``is_torch_bf16_gpu_available()``, which knows device types by name and
answered False on flagos ("Your setup doesn't support bf16/gpu"); accelerate,
which then runs the steps under ``torch.autocast("flagos", torch.bfloat16)``,
already asks ``torch.flagos.is_bf16_supported()``.

2. ``Trainer`` checkpoints keep flagos' random state. ``_save_rng_state`` and
``_load_rng_state`` save and restore the generators of the device types
transformers lists (cuda, npu, hpu, mlu, musa), so a run resumed from a
checkpoint drew other dropout masks on flagos than the uninterrupted run. The
checkpoint's ``rng_state*.pth`` gains a ``"flagos"`` entry, written and read
as transformers does for CUDA's (every device's state in distributed runs).

3. ``pipeline()`` stays on flagos. A pipeline given no device, or a device
index, takes accelerator ``index`` from the same fixed list and otherwise
falls back to the CPU, moving a flagos model there without a word. Where
``torch.accelerator`` names flagos (no accelerator transformers knows is
present), an index means ``flagos:<index>``, as it means ``cuda:<index>``
with CUDA.
"""

import functools
import inspect
import os

import torch

from . import _import_hooks
from ._wrap import wrap_once

_MODULE = "transformers.training_args"
_TRAINER = "transformers.trainer"
_PIPELINES = "transformers.pipelines.base"


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
    import transformers.training_args as training_args

    if not callable(getattr(training_args, "is_torch_bf16_gpu_available", None)):
        raise AttributeError(f"{_MODULE}.is_torch_bf16_gpu_available is gone")
    wrap_once(training_args, "is_torch_bf16_gpu_available", _knowing_flagos_bf16)


def _knowing_flagos_bf16(original):
    @functools.wraps(original)
    def is_torch_bf16_gpu_available():
        if original():
            return True
        return _flagos_is_the_accelerator() and torch.flagos.is_bf16_supported()

    return is_torch_bf16_gpu_available


def _rng_file(trainer, directory: str) -> str:
    """The checkpoint file transformers keeps this process's random states in."""
    if trainer.args.world_size <= 1:
        return os.path.join(directory, "rng_state.pth")
    return os.path.join(directory, f"rng_state_{trainer.args.process_index}.pth")


def _distributed(trainer) -> bool:
    from transformers.training_args import ParallelMode

    return trainer.args.parallel_mode == ParallelMode.DISTRIBUTED


def _saving_flagos_rng(original):
    @functools.wraps(original)
    def _save_rng_state(self, output_dir):
        original(self, output_dir)
        if not torch.flagos.is_initialized():
            return  # no flagos generator was used: nothing to restore
        path = _rng_file(self, output_dir)
        states = torch.load(path, weights_only=False)
        states["flagos"] = (torch.flagos.get_rng_state_all() if _distributed(self)
                            else torch.flagos.get_rng_state())
        torch.save(states, path)

    return _save_rng_state


def _loading_flagos_rng(original):
    @functools.wraps(original)
    def _load_rng_state(self, checkpoint):
        original(self, checkpoint)
        path = None if checkpoint is None else _rng_file(self, checkpoint)
        if path is None or not os.path.isfile(path):
            return  # transformers said why, where it matters
        from transformers.trainer_pt_utils import safe_globals, set_rng_state_for_device

        with safe_globals():
            states = torch.load(path, weights_only=True)
        if "flagos" in states:
            # Logs, as for CUDA, when the states do not fit this run's devices.
            set_rng_state_for_device("FLAGOS", torch.flagos, states, _distributed(self))

    return _load_rng_state


def _patch_trainer() -> None:
    from transformers.trainer import Trainer

    for name, wrapper in (("_save_rng_state", _saving_flagos_rng),
                          ("_load_rng_state", _loading_flagos_rng)):
        if not callable(getattr(Trainer, name, None)):
            raise AttributeError(f"{_TRAINER}.Trainer.{name} is gone")
        wrap_once(Trainer, name, wrapper)


def _flagos_is_the_accelerator() -> bool:
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and accelerator.type == "flagos"


def _staying_on_flagos(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        device = bound.arguments.get("device")
        model = bound.arguments.get("model")
        # What transformers reads as "accelerator <index>": None without an
        # accelerate device map, or an index >= 0 (a bool is no index).
        index = 0 if device is None else device
        if (type(index) is int and index >= 0 and
                getattr(model, "hf_device_map", None) is None and _flagos_is_the_accelerator()):
            bound.arguments["device"] = torch.device("flagos", index)
        original(*bound.args, **bound.kwargs)

    return __init__


def _patch_pipelines() -> None:
    from transformers.pipelines.base import Pipeline

    if "device" not in inspect.signature(Pipeline.__init__).parameters:
        raise AttributeError(f"{_PIPELINES}.Pipeline.__init__ takes no device")
    wrap_once(Pipeline, "__init__", _staying_on_flagos)


def install() -> None:
    _import_hooks.after_import(
        _MODULE, _patch_training_arguments,
        "Trainer may put the model on flagos and its batches on the CPU (use_cpu=True keeps "
        "both on the CPU), and refuse bf16=True on flagos",
    )
    _import_hooks.after_import(
        _TRAINER, _patch_trainer,
        "a Trainer resumed from a checkpoint draws other random numbers on flagos than the "
        "uninterrupted run",
    )
    _import_hooks.after_import(
        _PIPELINES, _patch_pipelines,
        "pipeline() without a device moves a flagos model to the CPU (pass device=\"flagos\")",
    )
