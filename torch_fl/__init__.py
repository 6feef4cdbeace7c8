"""torch_fl: the ``flagos`` device for PyTorch.

``import torch_fl`` (or just ``import torch``, through the ``torch.backends``
entry point) registers the PrivateUse1 backend under the name ``flagos``:
``torch.randn(3, device="flagos")`` then runs on the driver chosen by
``FLAGOS_ACCELERATOR`` (``host`` on any machine, ``cuda`` on NVIDIA GPUs).
"""

import torch

# Loading the extension registers the allocator, device guard, hooks and
# kernels (at library load).
from . import _C

# Registration steps are idempotent: after a configuration error the package
# can be imported again (torch_fl_autoload relies on it).
if torch._C._get_privateuse1_backend_name() != "flagos":
    torch.utils.rename_privateuse1_backend("flagos")

from . import flagos  # noqa: E402
from . import flaggems  # noqa: E402
from . import routing  # noqa: E402
from . import compile as _compile  # noqa: E402
from . import distributed  # noqa: E402
from . import _distributed_checkpoint  # noqa: E402
from . import _dtensor_random  # noqa: E402
from . import _autograd_threads  # noqa: E402
from . import _comm  # noqa: E402
from . import _transformers  # noqa: E402
from . import _env_names  # noqa: E402

if getattr(torch, "flagos", None) is not flagos:
    if hasattr(torch, "flagos"):
        delattr(torch, "flagos")  # left by an import that failed validation
    torch._register_device_module("flagos", flagos)
if not hasattr(torch.Tensor, "is_flagos"):
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )

# Validation: the driver (FLAGOS_ACCELERATOR, FLAGOS_HOST_*), then routing
# (config file, FLAGOS_OP_*, policies). A mistake raises here, naming it.
# A FLAGOS_* name torch_fl does not know (a misspelling) is warned about.
_env_names.warn_unknown()
_C._init()
# Host driver: autograd's flagos worker thread takes the caller's intra-op thread count.
_autograd_threads.install()
flaggems.register()
routing.reload()
# torch.compile: registers with Dynamo and Inductor when they are first used.
_compile.install()
distributed.register()
# torch.distributed.checkpoint: flagos tensors copied to the CPU where CUDA is also present.
_distributed_checkpoint.install()
# DTensor random operators on host-driver flagos meshes: the CPU's path, not CUDA's Philox tracker.
_dtensor_random.install()
# nn.DataParallel and torch.nn.parallel.comm on a torch without CUDA's copies between devices.
_comm.install()
# Hugging Face Trainer: TrainingArguments.device agrees with accelerate's (flagos).
_transformers.install()
# torch.multiprocessing: a clear error for flagos tensors, not a hung queue.
flagos._sharing.install()
# What PyTorch's Python layer gets wrong for a renamed PrivateUse1 device:
# torch.from_dlpack's device query, and pickling the host driver's generators.
flagos._dlpack.install()
flagos.random.install_generator_pickling()

from . import verify  # noqa: E402
from . import tuning  # noqa: E402
from . import report  # noqa: E402

# Observers the environment turns on (docs/tuning.md); routing.reload()
# validated the variables. Each writes or prints its results at exit.
# Each is marked started on the extension (which a failed import leaves
# loaded) only once it has started, so that an import retried after one
# raised starts it then, and never starts one twice.
def _start_observers() -> None:
    import atexit
    import os

    started = getattr(_C, "_observers_started", None)
    if not isinstance(started, set):
        started = _C._observers_started = set()
    for name, wanted, start in (
        ("verify", os.environ.get("FLAGOS_VERIFY", "0") != "0",
         lambda: atexit.register(verify._report_at_exit)),
        ("tune", bool(os.environ.get("FLAGOS_TUNE")), tuning._start_from_env),
        ("report", bool(os.environ.get("FLAGOS_REPORT")), report._start_from_env),
    ):
        if wanted and name not in started:
            start()
            started.add(name)


_start_observers()

__version__ = "0.1.0"


def _let_autograd_device_threads_start():
    # PyTorch starts one autograd thread per flagos device at the first
    # backward; each must take the GIL once to finish starting. If the
    # interpreter finalizes first, Python ends that thread with a forced unwind
    # through a noexcept frame and the process aborts ("terminate called
    # without an active exception"). Releasing the GIL briefly at exit lets
    # them finish. Only processes that used the device pay the few ms.
    if _C._is_initialized():
        import time

        time.sleep(0.01)


import atexit  # noqa: E402

atexit.register(_let_autograd_device_threads_start)


def is_flaggems_enabled() -> bool:
    """Whether FlagGems' Triton kernels serve any operator in this process.

    The ``flaggems`` provider needs the cuda driver and an importable
    ``flag_gems``; on the host driver this is always False.
    ``torch_fl.flaggems.registered_ops()`` lists the operators served through
    FlagGems' Python wrappers, ``torch_fl.flaggems.cpp_ops()`` those launched
    from C++ (the only ones with FLAGOS_DISABLE_FLAGGEMS_PY=1).
    """
    return bool(flaggems.registered_ops()) or bool(flaggems.cpp_ops())


def get_registered_ops() -> list:
    """Operators registered on the flagos (PrivateUse1) dispatch key.

    Both flagos' own kernels and the routes registered per operator (the
    unboxed and direct routes); every other operator reaches the boxed
    routing kernel, the key's fallback (see docs/architecture.md).
    """
    return sorted(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))


def driver() -> str:
    """Name of the active driver: ``host`` or ``cuda``."""
    return _C._driver_name()


__all__ = ["flagos", "flaggems", "routing", "distributed", "verify", "tuning", "report",
           "is_flaggems_enabled", "get_registered_ops", "driver"]
