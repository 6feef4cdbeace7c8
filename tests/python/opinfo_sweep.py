"""OpInfo differential sweep: every float32 OpInfo sample, CPU vs flagos.

Used by tests/python/test_opinfo.py; also runnable on its own for a detailed
report::

    PYTHONPATH=. .venv/bin/python tests/python/opinfo_sweep.py [--ops a,b] [-v]

For each OpInfo of PyTorch's ``op_db`` whose CPU dtypes include float32, every
sample of ``op.sample_inputs("cpu", torch.float32)`` (at most
``MAX_SAMPLES_PER_OP`` of them, the first ones, see below) is

1. copied to flagos (before anything runs, so an op that writes its inputs
   cannot change what the other side sees). The copy keeps each tensor's exact
   geometry: sizes, strides (also 0-strides of expanded tensors and overlap),
   storage offset, and aliasing between tensors of one sample (tensors that
   share a CPU storage share one flagos storage);
2. run on CPU after ``torch.manual_seed(SEED)``; if that raises, the sample
   is a "cpu-skip" and not counted;
3. run on flagos after the same ``torch.manual_seed(SEED)``: the host driver's
   generator is CPU's mt19937 seeded by ``torch.manual_seed``, so random ops
   give the CPU's numbers and are compared in full;
4. compared: results (every tensor must be a flagos tensor; values with
   ``torch.testing.assert_close``, dtype included), non-tensor results with
   ``==``, and the sample's tensor arguments afterwards (catches in-place and
   out= writes that do not reach the flagos tensor).

Ops whose output is uninitialised memory (``empty*``: OpInfo's
``has_nondeterministic_output``) are compared on shape, dtype and device only.
Sparse, quantized and nested-tensor ops, and samples with a non-strided tensor
input, are "not applicable" (flagos is a strided-only device): counted apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
import traceback
import types
import unittest
from typing import Any

import torch


def _ensure_expecttest() -> None:
    """torch.testing._internal.common_utils imports ``expecttest`` (a test-only
    PyPI package) for one base class; a stand-in is enough for op_db."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        mod = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802
                self.assertEqual(actual, expect)

        mod.TestCase = TestCase
        sys.modules["expecttest"] = mod


_ensure_expecttest()

import torch_fl  # noqa: E402,F401  registers the flagos device
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

DEVICE = "flagos"
SEED = 1234
# Deterministic cap: the first N samples of each op, in OpInfo's order.
MAX_SAMPLES_PER_OP = 40
RTOL = 1.3e-6
ATOL = 1e-5

# Ops that are not applicable to a strided-only device.
_NA_PREFIXES = ("sparse.", "to_sparse", "_sparse", "nested", "_nested",
                "quantize", "dequantize", "fake_quantize", "_fake_quantize")


@dataclasses.dataclass
class Failure:
    op: str
    index: int
    error: str


@dataclasses.dataclass
class Result:
    passed: int = 0
    compared: int = 0
    cpu_skip: int = 0
    not_applicable: int = 0          # samples
    na_ops: list = dataclasses.field(default_factory=list)
    no_float32_ops: list = dataclasses.field(default_factory=list)
    meta_only: int = 0               # compared on shape/dtype/device only
    sample_gen_errors: list = dataclasses.field(default_factory=list)
    capped_ops: dict = dataclasses.field(default_factory=dict)   # op -> total
    failures: list = dataclasses.field(default_factory=list)
    ops_run: int = 0
    seconds: float = 0.0
    op_seconds: dict = dataclasses.field(default_factory=dict)

    def summary(self) -> str:
        pct = 100.0 * self.passed / self.compared if self.compared else 0.0
        failed_ops = len({f.op for f in self.failures})
        return (
            f"OpInfo sweep: {self.passed} passed / {self.compared} compared "
            f"({pct:.2f}%), {len(self.failures)} failed in {failed_ops} ops, "
            f"{self.cpu_skip} cpu-skip, {self.not_applicable} not-applicable "
            f"samples + {len(self.na_ops)} not-applicable ops, "
            f"{self.meta_only} meta-only, {self.ops_run} ops, "
            f"{len(self.no_float32_ops)} ops without float32, "
            f"{len(self.capped_ops)} ops capped at {MAX_SAMPLES_PER_OP} samples, "
            f"{self.seconds:.0f}s"
        )


def float32_ops():
    return [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]


def op_not_applicable(op) -> bool:
    name = op.name
    return name.startswith(_NA_PREFIXES) or "sparse" in name or "nested" in name


# --------------------------------------------------------------------------
# moving a sample to flagos


class _NotApplicable(Exception):
    pass


class _ToFlagos:
    """Copies a sample's tensors to flagos, keeping geometry and aliasing."""

    def __init__(self):
        self.storages: dict[int, torch.UntypedStorage] = {}

    def tensor(self, t: torch.Tensor) -> torch.Tensor:
        if t.layout != torch.strided or t.is_quantized or t.is_nested:
            raise _NotApplicable(f"{t.layout} input")
        if t.device.type != "cpu":
            return t
        if t.is_conj() or t.is_neg():
            return t.resolve_conj().resolve_neg().to(DEVICE)
        st = t.untyped_storage()
        key = st.data_ptr() if st.nbytes() else id(st)
        fl = self.storages.get(key)
        if fl is None:
            raw = torch.empty(0, dtype=torch.uint8).set_(st)
            fl = raw.to(DEVICE).untyped_storage()
            self.storages[key] = fl
        out = torch.empty(0, dtype=t.dtype, device=DEVICE)
        out.set_(fl, t.storage_offset(), t.size(), t.stride())
        return out

    def __call__(self, x: Any, key: str | None = None) -> Any:
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, torch.device) and x.type == "cpu":
            return torch.device(DEVICE)
        if isinstance(x, str) and x == "cpu":  # e.g. device="cpu", x.to("cpu")
            return DEVICE
        if isinstance(x, torch.Generator):
            g = torch.Generator(device=DEVICE)
            g.set_state(x.get_state())
            return g
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(self(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(self(v) for v in x)
        if isinstance(x, dict):
            return {k: self(v, k) for k, v in x.items()}
        return x


def _has_non_strided(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.layout != torch.strided or x.is_quantized or x.is_nested
    if isinstance(x, (list, tuple)):
        return any(_has_non_strided(v) for v in x)
    if isinstance(x, dict):
        return any(_has_non_strided(v) for v in x.values())
    return False


# --------------------------------------------------------------------------
# comparing


class _Mismatch(Exception):
    pass


def _compare(expected: Any, actual: Any, path: str, meta_only: bool) -> None:
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise _Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
        exp_dev = DEVICE if expected.device.type == "cpu" else expected.device.type
        if actual.device.type != exp_dev:
            raise _Mismatch(f"{path}: result on {actual.device}, expected {exp_dev}")
        if expected.layout != actual.layout:
            raise _Mismatch(f"{path}: layout {actual.layout} != {expected.layout}")
        act = actual.cpu()
        if meta_only:
            if act.shape != expected.shape or act.dtype != expected.dtype:
                raise _Mismatch(f"{path}: {act.dtype}{list(act.shape)} != "
                                f"{expected.dtype}{list(expected.shape)}")
            return
        try:
            torch.testing.assert_close(act, expected, rtol=RTOL, atol=ATOL,
                                       equal_nan=True, check_device=False)
        except AssertionError as e:
            msg = " ".join(str(e).split())
            raise _Mismatch(f"{path}: {msg[:300]}") from None
        return
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise _Mismatch(f"{path}: expected {type(expected).__name__} of "
                            f"{len(expected)}, got {type(actual).__name__} "
                            f"{len(actual) if isinstance(actual, (list, tuple)) else ''}")
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare(e, a, f"{path}[{i}]", meta_only)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or expected.keys() != actual.keys():
            raise _Mismatch(f"{path}: dict keys differ")
        for k in expected:
            _compare(expected[k], actual[k], f"{path}[{k!r}]", meta_only)
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
        if meta_only or math.isclose(actual, expected, rel_tol=RTOL, abs_tol=ATOL):
            return
        raise _Mismatch(f"{path}: {actual!r} != {expected!r}")
    if isinstance(expected, torch.device):
        exp = torch.device(DEVICE) if expected.type == "cpu" else expected
        if not isinstance(actual, torch.device) or actual.type != exp.type:
            raise _Mismatch(f"{path}: {actual!r} != {exp!r}")
        return
    if meta_only:
        return
    if expected != actual:
        raise _Mismatch(f"{path}: {actual!r} != {expected!r}")


def _compare_tensors(expected: Any, actual: Any, path: str) -> None:
    """Compares only the tensors of two like structures (sample arguments)."""
    if isinstance(expected, torch.Tensor):
        _compare(expected, actual, path + " after the call", False)
    elif isinstance(expected, (list, tuple)):
        for i, (e, a) in enumerate(zip(expected, actual)):
            _compare_tensors(e, a, f"{path}[{i}]")
    elif isinstance(expected, dict):
        for k in expected:
            _compare_tensors(expected[k], actual[k], f"{path}[{k!r}]")


def _error_text(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:300]}"


# --------------------------------------------------------------------------
# the sweep


def run_op(op, res: Result, max_samples: int = MAX_SAMPLES_PER_OP) -> None:
    name = op.full_name
    meta_only = bool(op.has_nondeterministic_output)
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    except Exception as e:  # noqa: BLE001
        res.sample_gen_errors.append((name, _error_text(e)))
        return
    if len(samples) > max_samples:
        res.capped_ops[name] = len(samples)
        samples = samples[:max_samples]
    for i, s in enumerate(samples):
        if _has_non_strided((s.input, s.args, s.kwargs)):
            res.not_applicable += 1
            continue
        try:
            mover = _ToFlagos()
            f_input, f_args, f_kwargs = mover((s.input, s.args, s.kwargs))
        except _NotApplicable:
            res.not_applicable += 1
            continue
        except Exception as e:  # noqa: BLE001
            res.compared += 1
            res.failures.append(Failure(name, i, "moving the sample to flagos: "
                                        + _error_text(e)))
            continue
        try:
            torch.manual_seed(SEED)
            expected = op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001
            res.cpu_skip += 1
            continue
        if _has_non_strided(expected):
            res.not_applicable += 1
            continue
        res.compared += 1
        if meta_only:
            res.meta_only += 1
        try:
            torch.manual_seed(SEED)
            actual = op(f_input, *f_args, **f_kwargs)
            _compare(expected, actual, "result", meta_only)
            if not meta_only:
                _compare_tensors((s.input, s.args, s.kwargs),
                                 (f_input, f_args, f_kwargs), "input")
        except _Mismatch as e:
            res.failures.append(Failure(name, i, str(e)))
            continue
        except Exception as e:  # noqa: BLE001
            res.failures.append(Failure(name, i, _error_text(e)))
            continue
        res.passed += 1


def sweep(only: set[str] | None = None, verbose: bool = False,
          max_samples: int = MAX_SAMPLES_PER_OP) -> Result:
    res = Result()
    start = time.perf_counter()
    for op in op_db:
        name = op.full_name
        if only is not None and name not in only and op.name not in only:
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            res.no_float32_ops.append(name)
            continue
        if op_not_applicable(op):
            res.na_ops.append(name)
            continue
        t0 = time.perf_counter()
        nfail = len(res.failures)
        run_op(op, res, max_samples)
        res.ops_run += 1
        res.op_seconds[name] = time.perf_counter() - t0
        if verbose:
            print(f"{name:50s} {res.op_seconds[name]:6.2f}s "
                  f"{len(res.failures) - nfail} fail", flush=True)
    res.seconds = time.perf_counter() - start
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", help="comma-separated op names (default: all)")
    p.add_argument("--max-samples", type=int, default=MAX_SAMPLES_PER_OP)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--slowest", type=int, default=0)
    a = p.parse_args(argv)
    only = set(a.ops.split(",")) if a.ops else None
    res = sweep(only, a.verbose, a.max_samples)
    for f in res.failures:
        print(f"FAIL {f.op} [{f.index}] {f.error}")
    for name, err in res.sample_gen_errors:
        print(f"SAMPLE-GEN-ERROR {name}: {err}")
    if a.slowest:
        for name, sec in sorted(res.op_seconds.items(), key=lambda kv: -kv[1])[:a.slowest]:
            print(f"SLOW {name} {sec:.2f}s")
    print(res.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
