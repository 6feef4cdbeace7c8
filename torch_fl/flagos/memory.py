"""Memory statistics of the flagos caching allocator (shaped like torch.cuda's)."""

from .. import _C
from ._device import _device_index


def memory_stats(device=None) -> dict:
    """All allocator counters of ``device``, keyed like torch.cuda.memory_stats()."""
    return dict(sorted(_C._memory_stats(_device_index(device)).items()))


def memory_allocated(device=None) -> int:
    """Bytes held by live flagos tensors on ``device``."""
    return _C._memory_stats(_device_index(device))["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return _C._memory_stats(_device_index(device))["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """Bytes held from the driver: allocated plus cached."""
    return _C._memory_stats(_device_index(device))["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return _C._memory_stats(_device_index(device))["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _C._reset_peak_memory_stats(_device_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    _C._reset_accumulated_memory_stats(_device_index(device))


def empty_cache() -> None:
    """Returns every cached, unused block to the driver."""
    _C._empty_cache()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of ``device`` as the driver sees them."""
    return tuple(_C._mem_get_info(_device_index(device)))
