"""torch_fl.verify: shadow verification of routed calls.

With ``FLAGOS_VERIFY=1`` (or :func:`enable`), every routed call also runs on
the reference kernels (PyTorch's CPU kernels on the host driver, CUDA's on the
cuda driver) over copies of its inputs, and its outputs are compared with
tolerances per dtype. The workload's own call runs as it would without
verification, so its results, in-place and out= semantics are unchanged.

- ``FLAGOS_VERIFY=1``: record; the operators that diverge are printed at exit
  and :func:`records` / :func:`diverging` return them;
- ``FLAGOS_VERIFY=error``: the first divergence raises a RuntimeError naming
  the operator, the backend and the error;
- random operators are not compared (a second run would move the random
  stream); they are counted as skipped.

Docs: docs/tuning.md.
"""

import contextlib
import sys
from typing import NamedTuple

import torch

from . import _C

MODES = {"0": "off", "1": "compare and report", "error": "raise at the first divergence"}


class VerifyRecord(NamedTuple):
    op: str  # "aten::mm"
    backend: str  # the backend its calls were routed to
    compared: int  # calls compared with the reference
    failed: int  # calls whose outputs diverged
    skipped: int  # calls not compared (random operators, reference errors)
    max_abs: float  # largest |got - reference| over every compared output element
    max_rel: float  # largest |got - reference| / |reference| (where |reference| >= atol)
    first_failure_call: str  # signature of the first failing call
    first_failure: str  # what differed there
    skip_reason: str


def _check_mode(mode: str) -> str:
    mode = {"report": "1", "off": "0", True: "1", False: "0"}.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"verify mode {mode!r} is not valid: use "
                         + ", ".join(f"{k!r} ({v})" for k, v in MODES.items()))
    return mode


def enable(mode: str = "1") -> None:
    """Turns verification on: ``"1"`` (or ``"report"``) records, ``"error"`` raises.

    Overrides FLAGOS_VERIFY until :func:`disable` or :func:`use_environment`.
    """
    _C._set_verify_mode(_check_mode(mode))


def disable() -> None:
    """Turns verification off (overrides FLAGOS_VERIFY)."""
    _C._set_verify_mode("0")


def use_environment() -> None:
    """Drops :func:`enable` / :func:`disable`: FLAGOS_VERIFY decides again."""
    _C._set_verify_mode(None)


def mode() -> str:
    """The mode in force: ``"0"``, ``"1"`` or ``"error"``."""
    return _C._verify_mode()


@contextlib.contextmanager
def verifying(mode: str = "1"):
    """Verification on inside the block; the previous mode after it."""
    before = _C._verify_mode()
    enable(mode)
    try:
        yield
    finally:
        _C._set_verify_mode(before)


def records() -> list:
    """One :class:`VerifyRecord` per (operator, backend) verified so far."""
    return [VerifyRecord(**r) for r in _C._verify_records()]


def diverging() -> list:
    """The records of operators whose outputs diverged from the reference."""
    return [r for r in records() if r.failed]


def reset() -> None:
    """Forgets every record."""
    _C._reset_verify_records()


def reference_backend() -> str:
    """The backend verification compares with: ``cpu`` (host driver) or ``cuda``."""
    return _C._reference_backend()


def tolerance(dtype: torch.dtype) -> tuple:
    """(rtol, atol) for outputs of ``dtype`` (0, 0 for integers and bool)."""
    return tuple(_C._tolerance(dtype))


def set_tolerance(dtype: torch.dtype, rtol: float, atol: float) -> None:
    """Replaces the tolerance of a floating (or complex) dtype, for verification and tuning."""
    _C._set_tolerance(dtype, float(rtol), float(atol))


def reset_tolerances() -> None:
    _C._reset_tolerances()


def summary(recs=None) -> str:
    """The report as text: what was compared, and every diverging operator."""
    recs = records() if recs is None else recs
    if not recs:
        return "flagos verify: no routed call was verified"
    compared = sum(r.compared for r in recs)
    skipped = sum(r.skipped for r in recs)
    bad = [r for r in recs if r.failed]
    lines = [f"flagos verify: {compared} calls of {len({r.op for r in recs})} operators compared "
             f"with the reference ({reference_backend()} kernels)"
             + (f", {skipped} not compared (random operators or reference errors)" if skipped else "")
             + (f"; {len(bad)} diverge:" if bad else "; none diverges")]
    for r in sorted(bad, key=lambda r: -r.failed):
        lines.append(f"  {r.op} on {r.backend}: {r.failed} of {r.compared} calls diverge "
                     f"(max abs error {r.max_abs:.3g}, max rel error {r.max_rel:.3g}); "
                     f"first: {r.first_failure_call}: {r.first_failure}")
    return "\n".join(lines)


def _report_at_exit() -> None:
    if mode() != "0" or records():
        print(summary(), file=sys.stderr, flush=True)


__all__ = ["VerifyRecord", "diverging", "disable", "enable", "mode", "records", "reference_backend",
           "reset", "reset_tolerances", "set_tolerance", "summary", "tolerance", "use_environment",
           "verifying"]
