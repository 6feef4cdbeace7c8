"""Memory statistics of the flagos caching allocator (shaped like torch.cuda's)."""

import warnings

import torch

from .. import _C
from ._device import _device_index, _index_or_current, _on_cuda


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


def ipc_collect() -> None:
    """Frees the memory this process sent to others that they have all released.

    As ``torch.cuda.ipc_collect``: on the cuda driver flagos tensors travel by CUDA
    IPC, whose sender keeps a block until every receiver lets go and checks only
    now and then. Host-driver segments are freed by the last process to release
    them, so there is nothing to collect.
    """
    if _on_cuda():
        torch.cuda.ipc_collect()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of ``device`` as the driver sees them."""
    return tuple(_C._mem_get_info(_device_index(device)))


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats() nested at its dots: {"allocated_bytes": {"all": {"current": ...}}}."""
    nested: dict = {}
    for key, value in memory_stats(device).items():
        *path, leaf = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _deprecated(message: str) -> None:
    """torch.cuda's FutureWarning for a name kept for old scripts, pointing at the caller."""
    warnings.warn(f"torch.flagos.{message}", FutureWarning, stacklevel=3)


def reset_max_memory_allocated(device=None) -> None:
    """Kept for scripts written for torch.cuda: resets every peak, as
    reset_peak_memory_stats does."""
    _deprecated("reset_max_memory_allocated resets all peak memory statistics: "
                "call torch.flagos.reset_peak_memory_stats")
    reset_peak_memory_stats(device)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    """Caps the memory this process may hold on ``device``, cached blocks included, at
    ``fraction`` (0 to 1) of the device's total: an allocation beyond it raises
    torch.OutOfMemoryError, as with torch.cuda's. 1.0 lifts the cap. On the cuda driver
    flagos and torch.cuda share one caching allocator, so this is torch.cuda's fraction for
    the same GPU."""
    # The range (NaN included) is checked once, in C++, where _C callers meet it too.
    if not isinstance(fraction, float):
        raise TypeError(f"the memory fraction must be a float, not {type(fraction).__name__}")
    _C._set_memory_fraction(fraction, _device_index(device))


def get_per_process_memory_fraction(device=None) -> float:
    """The fraction set_per_process_memory_fraction set for ``device`` (1.0 when unset)."""
    return _C._memory_fraction(_device_index(device))


def memory_cached(device=None) -> int:
    """Kept for scripts written for torch.cuda: memory_reserved()."""
    _deprecated("memory_cached has been renamed to torch.flagos.memory_reserved")
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Kept for scripts written for torch.cuda: max_memory_reserved()."""
    _deprecated("max_memory_cached has been renamed to torch.flagos.max_memory_reserved")
    return max_memory_reserved(device)


def reset_max_memory_cached(device=None) -> None:
    """Kept for scripts written for torch.cuda: resets every peak, as
    reset_peak_memory_stats does."""
    _deprecated("reset_max_memory_cached resets all peak memory statistics: "
                "call torch.flagos.reset_peak_memory_stats")
    reset_peak_memory_stats(device)


def _format_bytes(n: int) -> str:
    if abs(n) < 1024:
        return f"{n} B"
    exponent = min(3, (abs(n).bit_length() - 1) // 10)  # KiB, MiB or GiB
    return f"{n / (1 << 10 * exponent):.2f} {'KMG'[exponent - 1]}iB".replace(".00 ", " ")


# (title, memory_stats prefix, counts bytes)
_SUMMARY_ROWS = (
    ("Allocated memory", "allocated_bytes", True),
    ("Active memory", "active_bytes", True),
    ("Requested memory", "requested_bytes", True),
    ("Reserved memory", "reserved_bytes", True),
    ("Allocations", "allocation", False),
    ("Active allocs", "active", False),
    ("Segments", "segment", False),
)


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of the allocator's counters for ``device``, as torch.cuda.memory_summary
    prints them: current, peak, total allocated and total freed, for all blocks and
    (unless ``abbreviated``) for the small and large pools apart."""
    index = _index_or_current(device)
    stats = memory_stats(index)
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    rows = [("", "Cur Usage", "Peak Usage", "Tot Alloc", "Tot Freed")]
    for title, prefix, in_bytes in _SUMMARY_ROWS:
        for pool in pools:
            label = title if pool == "all" else f"  from {pool.replace('_', ' ')}"
            cells = (stats[f"{prefix}.{pool}.{c}"] for c in ("current", "peak", "allocated", "freed"))
            rows.append((label, *(_format_bytes(v) if in_bytes else str(v) for v in cells)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def fmt(row):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([f"flagos memory summary, device flagos:{index}", rule, fmt(rows[0]), rule,
                      *map(fmt, rows[1:]), rule,
                      f"Allocation retries: {stats['num_alloc_retries']}    "
                      f"Out-of-memory errors: {stats['num_ooms']}", rule])


# ---- snapshots and the memory history (the memory visualizer's input) ------------------------
# On the cuda driver flagos memory is CUDA's caching allocator, so these are
# torch.cuda.memory's own, over flagos and CUDA tensors alike. The host
# driver's allocator caches whole blocks and records no history: it refuses.


def _cuda_memory(what: str):
    if not _on_cuda():
        raise RuntimeError(
            f"torch.flagos.memory.{what}: the host driver's allocator records no segments or "
            "allocation history (it caches whole blocks and never splits them); memory_stats() "
            "and memory_summary() describe it. On the cuda driver this is torch.cuda's own.")
    return torch.cuda.memory


def memory_snapshot(*args, **kwargs) -> list:
    """The allocator's segments and their blocks, as ``torch.cuda.memory_snapshot()``."""
    return _cuda_memory("memory_snapshot").memory_snapshot(*args, **kwargs)


def _record_memory_history(*args, **kwargs) -> None:
    """Starts (or, with ``enabled=None``, stops) recording allocations with their stack traces,
    as ``torch.cuda.memory._record_memory_history``."""
    return _cuda_memory("_record_memory_history")._record_memory_history(*args, **kwargs)


def _snapshot(device=None, **kwargs) -> dict:
    """Segments, blocks and the recorded history, as ``torch.cuda.memory._snapshot``."""
    memory = _cuda_memory("_snapshot")
    return memory._snapshot(None if device is None else _index_or_current(device), **kwargs)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles ``_snapshot()`` to ``filename`` for https://pytorch.org/memory_viz."""
    return _cuda_memory("_dump_snapshot")._dump_snapshot(filename)
