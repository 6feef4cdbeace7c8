"""torch.backends entry point of torch_fl (``import torch`` loads flagos).

Kept outside the torch_fl package on purpose: a configuration mistake (a bad
FLAGOS_* variable or backends.conf line) must not make ``import torch`` fail
for every program in the environment. Here it becomes a warning, and
``import torch_fl`` raises the full error.
"""

import sys
import warnings


def load() -> None:
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
