"""torch.backends entry point of torch_fl (``import torch`` may load flagos).

Kept outside the torch_fl package on purpose: a configuration mistake (a bad
FLAGOS_* variable or backends.conf line) must not make ``import torch`` fail
for every program in the environment. Here it becomes a warning, and
``import torch_fl`` raises the full error.

When ``import torch`` registers flagos. Registering a PrivateUse1 backend
makes it PyTorch's one accelerator (``at::getAccelerator()``), and from then on
PyTorch's autograd engine finds no stream for the nodes of any other
accelerator and fails every backward over CUDA tensors
(pytorch/pytorch#161129, torch 2.8 to 2.14 at least). A plugin can neither
undo the registration nor give those nodes a stream (docs/gpu.md). So the
entry point registers flagos only where no other accelerator is built into
torch (a CPU build of torch: there is nothing to harm). With a CUDA (or XPU,
MPS) build it leaves the process untouched, and a program that wants flagos
says so with ``import torch_fl``, or with ``FLAGOS_AUTOLOAD=1``.

FLAGOS_AUTOLOAD: ``auto`` (the default, as above), ``1`` (always register at
``import torch``) or ``0`` (never). ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` skips
every backend's entry point, this one included.
"""

import os
import sys
import warnings

VALUES = ("auto", "1", "0")


def decision():
    """(load, reason): whether ``import torch`` registers flagos in this process, and why.

    Raises ValueError for a FLAGOS_AUTOLOAD value other than auto, 1 or 0.
    """
    value = os.environ.get("FLAGOS_AUTOLOAD", "auto")
    if value not in VALUES:
        shown = value if len(value) <= 60 else value[:60] + "..."
        raise ValueError(f"FLAGOS_AUTOLOAD={shown!r} is not valid: use auto (the default), 1 or 0")
    if value != "auto":
        return value == "1", f"FLAGOS_AUTOLOAD={value}"
    import torch

    # The accelerator torch was built with, without initialising it (this
    # does not create a CUDA context or poison fork).
    other = torch.accelerator.current_accelerator()
    if other is None or other.type == "flagos":
        return True, "no other accelerator is built into torch"
    return False, (f"torch is built with {other.type}, whose autograd a registered flagos "
                   "would break; `import torch_fl` or FLAGOS_AUTOLOAD=1 registers it")


def load() -> None:
    try:
        register, _ = decision()
    except ValueError as e:
        warnings.warn(f"{e}; the flagos device was not loaded (`import torch_fl` loads it)",
                      RuntimeWarning, stacklevel=2)
        return
    if not register:
        return
    try:
        import torch_fl  # noqa: F401
    except (ValueError, RuntimeError, ImportError) as e:
        for name in [m for m in sys.modules if m == "torch_fl" or m.startswith("torch_fl.")]:
            if name != "torch_fl._C":  # the extension stays loaded; re-import re-validates
                del sys.modules[name]
        warnings.warn(
            f"the flagos device is not available: {e}\n"
            "(`import torch_fl` raises this error; TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips autoloading)",
            RuntimeWarning,
            stacklevel=2,
        )
