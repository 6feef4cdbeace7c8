"""DTensor's random operators on host-driver flagos meshes: the CPU's path.

DTensor runs random operators (``dropout``, ``normal_``, ``nn.init`` of a
sharded parameter, FSDP2's ``reset_parameters()`` after meta-device init)
through its offset-based RNG tracker on any device type whose module has
``set_rng_state`` (``is_rng_supported_mesh``). The tracker reads the
generator's state as CUDA's Philox state: a seed and an offset, 16 bytes. On
the host driver flagos' generator is the CPU's (Mersenne Twister, 5,056
bytes), so the tracker failed with a bare AssertionError. A CPU mesh is not
"supported" there, and its random operators draw from each rank's own
generator; a host-driver flagos mesh now gets that answer too (with the
CPU's warning), and flagos equals the CPU. On the cuda driver flagos'
generator is CUDA's, and the tracker is left to it.
"""

import functools
import warnings

from . import _import_hooks
from ._wrap import wrap_once

_RANDOM = "torch.distributed.tensor._random"
_DISPATCH = "torch.distributed.tensor._dispatch"
_CONSEQUENCE = ("random operators on DTensors of a flagos mesh fail on the host driver "
                "(FSDP2's reset_parameters() among them)")


def _cpu_answer_on_the_host(original):
    @functools.wraps(original)
    def is_rng_supported_mesh(device_mesh):
        from . import driver

        if device_mesh.device_type == "flagos" and driver() == "host":
            warnings.warn(
                "DTensor random operators may not have complete support on flagos device mesh "
                "(the host driver's generator is the CPU's, as on a cpu mesh)",
                stacklevel=2,
            )
            return False
        return original(device_mesh)

    return is_rng_supported_mesh


def _patch(module_name: str) -> None:
    import importlib

    module = importlib.import_module(module_name)
    if not callable(getattr(module, "is_rng_supported_mesh", None)):
        raise AttributeError(f"{module_name}.is_rng_supported_mesh is gone")
    wrap_once(module, "is_rng_supported_mesh", _cpu_answer_on_the_host)


def _patch_random() -> None:
    _patch(_RANDOM)


def _patch_dispatch() -> None:
    _patch(_DISPATCH)  # imports the function by name


def install() -> None:
    _import_hooks.after_import(_RANDOM, _patch_random, _CONSEQUENCE)
    _import_hooks.after_import(_DISPATCH, _patch_dispatch, _CONSEQUENCE)
