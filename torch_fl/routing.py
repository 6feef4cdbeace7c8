"""torch_fl.routing: which backend runs each operator, and how often.

Routes come from (highest first) :func:`set_route`, ``FLAGOS_OP_<op>``
variables, the config file (``FLAGOS_BACKEND_CONFIG`` or the packaged
``backends.conf``) and the default (FlagGems where it serves the op, else the
driver's native kernels). An operator's route is decided on its first call and
cached; :func:`set_route` and :func:`reload` make every operator decide again.
"""

import os
import warnings
from typing import NamedTuple

from . import _C

PACKAGED_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "backends.conf")


class Route(NamedTuple):
    op: str
    backend: str  # the chosen backend; the configured chain while unresolved
    source: str  # "api", "env FLAGOS_OP_mm", "file PATH:LINE" or "default"
    resolved: bool  # False: configured but not called yet
    cpu_fallback: bool
    via: str = ""  # flaggems ops: "c++" (launched from C++) or "python" (FlagGems' wrapper)


class OpStats(NamedTuple):
    op: str
    # backend -> number of calls; FlagGems' kernels count under "flaggems" when
    # launched from C++ and "flaggems-python" when its Python wrapper ran them.
    calls: dict
    cpu_fallbacks: int


class ConfigError(ValueError):
    """A mistake in the routing configuration (file, FLAGOS_* variables)."""


def _strict() -> bool:
    value = os.environ.get("FLAGOS_CONFIG_STRICT", "1")
    if value not in ("0", "1"):
        raise ConfigError(f"FLAGOS_CONFIG_STRICT={value!r} is not valid: use 1 (default) or 0")
    return value == "1"


def reload() -> None:
    """Reads the configuration again (file, FLAGOS_OP_*, policies).

    Raises :class:`ConfigError` listing every mistake, or only warns when
    ``FLAGOS_CONFIG_STRICT=0``; valid entries take effect either way.
    """
    strict = _strict()
    problems = _C._load_routing(PACKAGED_CONFIG)
    if not problems:
        return
    if strict:
        raise ConfigError(
            f"{len(problems)} routing configuration error(s) "
            "(FLAGOS_CONFIG_STRICT=0 turns them into warnings):\n  " + "\n  ".join(problems)
        )
    for p in problems:
        warnings.warn(f"flagos routing: {p}", stacklevel=2)


def set_route(op: str, backends: str) -> None:
    """Routes ``op`` ("mm", "add.Tensor") through ``backends`` ("cuda" or "flaggems, cuda").

    ``op="*"`` sets the chain of every operator that no route names. Takes
    precedence over the environment and the file; ``backends=""`` removes
    the override. Safe while other threads run operators: each
    operator picks up the new route on its next call.
    """
    if not isinstance(op, str) or not isinstance(backends, str):
        raise TypeError("set_route(op: str, backends: str)")
    _C._set_route(op, backends)


def table(op: str = None) -> list:
    """The routes: every operator called so far and every configured one."""
    if op is not None and not isinstance(op, str):
        raise TypeError(f"table(op): an operator name such as 'mm' or 'add.Tensor', not "
                        f"{type(op).__name__}")
    rows = [Route(*r) for r in _C._routing_table()]
    if op is not None:
        rows = [r for r in rows if r.op == op or r.op.split("::")[-1] == op
                or r.op.split("::")[-1].split(".")[0] == op]
    return rows


def stats() -> list:
    """Per-operator call counts by backend, and CPU-fallback counts.

    Calls routed to FlagGems appear as ``flaggems`` (launched from C++) and
    ``flaggems-python`` (its Python wrapper ran); :func:`flaggems_calls` sums them.
    """
    return [OpStats(*s) for s in _C._routing_stats()]


FLAGGEMS_KEYS = ("flaggems", "flaggems-python")


def flaggems_calls(calls: dict) -> int:
    """The calls of one OpStats.calls dict that ran FlagGems' kernels, either way."""
    return sum(calls.get(k, 0) for k in FLAGGEMS_KEYS)


def reset_stats() -> None:
    _C._reset_routing_stats()


def available_backends() -> list:
    """Backends the active driver provides."""
    return list(_C._available_backends())


def config_path() -> str:
    """The config file in force ('' when it could not be read)."""
    return _C._config_path()


def check_config(path) -> list:
    """Every mistake in config file ``path`` (a str or os.PathLike; an empty list when it is valid)."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"check_config(path): a file path (str or os.PathLike), not "
                        f"{type(path).__name__}") from None
    if not isinstance(path, str):
        path = os.fsdecode(path)
    return list(_C._check_config(path))


__all__ = [
    "ConfigError", "FLAGGEMS_KEYS", "OpStats", "Route", "available_backends", "check_config",
    "config_path", "flaggems_calls", "reload", "reset_stats", "set_route", "stats", "table",
]
