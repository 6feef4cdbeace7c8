"""torch.flagos: the device module, shaped like torch.cuda.

Also reachable as ``torch.flagos`` once torch_fl is imported.
"""

import torch

from .. import _C
from ._device import (
    can_device_access_peer,
    current_device,
    device,
    device_count,
    FlagosDeviceProperties,
    device_of,
    get_device_capability,
    get_device_name,
    get_device_properties,
    get_sync_debug_mode,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    set_sync_debug_mode,
    synchronize,
    _is_in_bad_fork,
    _lazy_init,
)
from . import _dlpack, _sharing  # noqa: F401
from . import amp  # noqa: F401  (torch.flagos.amp.autocast / GradScaler, as torch.cuda.amp)
from .amp import get_amp_supported_dtype
from .telemetry import (
    clock_rate,
    device_memory_used,
    list_gpu_processes,
    memory_usage,
    power_draw,
    temperature,
    utilization,
)
from .graphs import (
    FlagosGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from .memory import (
    empty_cache,
    get_per_process_memory_fraction,
    ipc_collect,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

# Inductor reads these from the device module when it first compiles
# (init_backend_registration). Resolving them lazily keeps Inductor out of
# `import torch_fl`; the first read registers flagos with Inductor.
_INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


def __getattr__(name):
    # torch.cuda's flag, read as `getattr(device_module, "_initialized", False)`
    # by torch.utils.checkpoint before it saves and restores the devices' RNG
    # states (dropout recomputed in backward must draw the same mask).
    if name == "_initialized":
        return is_initialized()
    if name in _INDUCTOR_NAMES:
        from ..compile import inductor_backend

        return getattr(inductor_backend(), name)
    raise AttributeError(f"module 'torch.flagos' has no attribute {name!r}")


def _inductor_backend_init() -> None:
    """The lazy Inductor hook of newer PyTorch releases (called at the first compile)."""
    from ..compile import inductor_backend

    inductor_backend()


# torch.cuda.OutOfMemoryError is this same class; flagos raises it when out of memory.
OutOfMemoryError = torch.OutOfMemoryError

__all__ = [
    "OutOfMemoryError",
    "Event",
    "FlagosDeviceProperties",
    "FlagosGraph",
    "Stream",
    "StreamContext",
    "can_device_access_peer",
    "clock_rate",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_memory_used",
    "device_of",
    "empty_cache",
    "ipc_collect",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "get_sync_debug_mode",
    "graph",
    "graph_pool_handle",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "is_initialized",
    "list_gpu_processes",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "memory_usage",
    "power_draw",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "set_sync_debug_mode",
    "stream",
    "synchronize",
    "temperature",
    "utilization",
]
