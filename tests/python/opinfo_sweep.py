"""OpInfo differential sweep: every float32 OpInfo sample, CPU vs flagos.

The engine of tests/python/test_opinfo.py (see docs/opinfo.md). Also runs on
its own, with a per-sample report::

    PYTHONPATH=. .venv/bin/python tests/python/opinfo_sweep.py [--ops a,b] [-v]

What is compared
----------------
For each OpInfo of PyTorch's ``op_db`` whose CPU dtypes include float32,
every sample of ``op.sample_inputs("cpu", torch.float32)`` (optionally only
the first ``--max-samples``; generated after ``torch.manual_seed(crc32(op
name))``, so sample ``i`` of an op is the same in every run) is

1. copied to flagos, before anything runs (an op that writes its inputs
   cannot change what the other side sees). The copy keeps each tensor's exact
   geometry: sizes, strides (0-strides of expanded tensors and overlap too),
   storage offset, and aliasing between tensors of one sample (tensors that
   share a CPU storage share one flagos storage). ``torch.device("cpu")`` and
   ``"cpu"`` arguments become flagos, CPU generators flagos ones in the same
   state. Exceptions: arguments PyTorch wants on the CPU whatever the device
   (``_CPU_ARGS``: tensor_split's indices) stay there;
2. run on CPU after ``torch.manual_seed(SEED)``; if that raises, the sample
   is a "cpu-skip" and not counted;
3. run on flagos after the same ``torch.manual_seed(SEED)``. The host driver's
   generator is CPU's mt19937, seeded by ``torch.manual_seed``, so random ops
   (rand*, normal, bernoulli, dropout, multinomial, ...) give the CPU's numbers
   and are compared in full. A sample without any tensor (a factory call such
   as ``arange(3)``) runs under ``torch.device("flagos")``: its CPU run used
   the default device;
4. compared: every result tensor must be a flagos tensor with the CPU result's
   dtype, shape and values (``torch.testing.assert_close``, ``equal_nan``,
   rtol 1.3e-6 / atol 1e-5); non-tensor results with ``==`` (floats with the
   same tolerances); and the sample's tensor arguments afterwards (in-place
   and out= writes must reach the flagos tensors the caller holds).

Ops whose output is uninitialised memory (``empty*``: OpInfo's
``has_nondeterministic_output``) are compared on shape, dtype and device only
("meta-only"). Sparse, quantized and nested-tensor ops, and samples with a
non-strided tensor in or out, are "not applicable" (flagos is a strided-only
device) and counted apart.

Crash isolation
---------------
Worker processes (one per CPU core, up to 4; ops dealt round-robin; one
intra-op thread each) import op_db once, without initialising the flagos
device, and run the ops in a forked child. A sample that kills the child (a
segfault, an abort) or runs past ``SAMPLE_TIMEOUT_S`` is a failure of that
sample ("crash: ..." / "timeout: ..."), and a new child goes on at the next
sample.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
import zlib
from typing import Any

DEVICE = "flagos"
SEED = 1234
# Optional deterministic cap: the first N samples of each op, in OpInfo's
# order. None: every sample (the whole sweep takes 20-50 s on 2 cores).
MAX_SAMPLES_PER_OP = None
RTOL = 1.3e-6
ATOL = 1e-5
SAMPLE_TIMEOUT_S = 120

# Ops that are not applicable to a strided-only device.
_NA_PREFIXES = ("sparse.", "to_sparse", "_sparse", "nested", "_nested")
_NA_WORDS = ("sparse", "nested", "quantized")

# Positional arguments that PyTorch requires on the CPU whatever the device
# (OpInfo makes them CPU tensors for CUDA too): they are not moved.
_CPU_ARGS = {
    "tensor_split": (0,),  # tensor_indices_or_sections
}

_PREFIX = "@@opinfo "


# --------------------------------------------------------------------------
# results (parent side)


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
    meta_only: int = 0               # compared on shape/dtype/device only
    ops_run: int = 0
    na_ops: list = dataclasses.field(default_factory=list)
    no_float32_ops: list = dataclasses.field(default_factory=list)
    sample_gen_errors: list = dataclasses.field(default_factory=list)
    capped_ops: list = dataclasses.field(default_factory=list)
    failures: list = dataclasses.field(default_factory=list)
    op_seconds: dict = dataclasses.field(default_factory=dict)
    crashes: int = 0
    seconds: float = 0.0
    max_samples: int | None = None

    @property
    def failed_ops(self) -> dict:
        """op -> its failures."""
        out: dict = {}
        for f in self.failures:
            out.setdefault(f.op, []).append(f)
        return out

    def summary(self) -> str:
        pct = 100.0 * self.passed / self.compared if self.compared else 0.0
        capped = (f"{len(self.capped_ops)} ops capped at {self.max_samples} samples, "
                  if self.max_samples is not None else "")
        return (
            f"OpInfo sweep: {self.passed} passed / {self.compared} compared "
            f"({pct:.2f}%), {len(self.failures)} failed in "
            f"{len(self.failed_ops)} ops, {self.cpu_skip} cpu-skip, "
            f"{self.meta_only} meta-only, {self.not_applicable} not-applicable "
            f"samples; {self.ops_run} ops run, {len(self.na_ops)} ops not "
            f"applicable, {len(self.no_float32_ops)} ops without float32, "
            f"{capped}{len(self.sample_gen_errors)} sample-generation errors, "
            f"{self.crashes} crashes/timeouts; {self.seconds:.0f}s"
        )

    def failure_lines(self) -> list[str]:
        """``op [sample indices] error``, one line per op and distinct error."""
        groups: dict = {}
        for f in self.failures:
            groups.setdefault((f.op, f.error), []).append(f.index)
        return [f"  {op} {idx} {err}" for (op, err), idx in groups.items()]

    def add(self, rec: dict) -> None:
        kind = rec["kind"]
        if kind == "sample":
            st = rec["status"]
            if st == "cpu-skip":
                self.cpu_skip += 1
            elif st == "na":
                self.not_applicable += 1
            else:
                self.compared += 1
                self.meta_only += bool(rec.get("meta"))
                if st == "pass":
                    self.passed += 1
                else:
                    self.failures.append(Failure(rec["op"], rec["i"], rec["error"]))
        elif kind == "op":
            self.ops_run += 1
            self.op_seconds[rec["op"]] = rec["seconds"]
            if rec.get("capped"):
                self.capped_ops.append(rec["op"])
            if rec.get("gen_error"):
                self.sample_gen_errors.append((rec["op"], rec["gen_error"]))
        elif kind == "skip-op":
            (self.na_ops if rec["why"] == "na" else self.no_float32_ops).append(rec["op"])


# --------------------------------------------------------------------------
# the worker: runs samples and prints one line per event


def _ensure_expecttest() -> None:
    """torch.testing._internal.common_utils imports ``expecttest`` (a test-only
    PyPI package, in requirements-dev.txt) for one base class; without it a
    stand-in is enough for op_db."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        import types
        import unittest

        mod = types.ModuleType("expecttest")

        class TestCase(unittest.TestCase):
            def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802
                self.assertEqual(actual, expect)

        mod.TestCase = TestCase
        sys.modules["expecttest"] = mod


class _NotApplicable(Exception):
    pass


class _Mismatch(Exception):
    pass


def _worker_main(start: tuple[int, int], stride: int, offset: int,
                 only: set | None, max_samples: int) -> None:
    import itertools
    import warnings

    warnings.simplefilter("ignore")
    _ensure_expecttest()
    import torch
    import torch_fl  # noqa: F401  registers the flagos device
    from torch.testing._internal.common_methods_invocations import op_db

    torch.set_num_threads(1)

    def emit(**rec):
        sys.stdout.write(_PREFIX + json.dumps(rec) + "\n")
        sys.stdout.flush()

    def is_special(t) -> bool:
        return t.layout != torch.strided or t.is_quantized or t.is_nested

    def has_special(x) -> bool:
        if isinstance(x, torch.Tensor):
            return is_special(x)
        if isinstance(x, (list, tuple)):
            return any(has_special(v) for v in x)
        if isinstance(x, dict):
            return any(has_special(v) for v in x.values())
        return False

    class ToFlagos:
        """Copies a sample's tensors to flagos, keeping geometry and aliasing."""

        def __init__(self):
            self.storages = {}

        def tensor(self, t):
            if is_special(t):
                raise _NotApplicable(f"{t.layout} input")
            if t.device.type != "cpu":
                return t
            if t.is_conj() or t.is_neg():
                # (float32 samples have none) keep it simple: a plain copy.
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

        def __call__(self, x):
            if isinstance(x, torch.Tensor):
                return self.tensor(x)
            if isinstance(x, torch.device) and x.type == "cpu":
                return torch.device(DEVICE)
            if isinstance(x, str) and x == "cpu":  # device="cpu", x.to("cpu")
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
                return {k: self(v) for k, v in x.items()}
            return x

    def compare(expected, actual, path, meta_only):
        if isinstance(expected, torch.Tensor):
            if not isinstance(actual, torch.Tensor):
                raise _Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
            want = DEVICE if expected.device.type == "cpu" else expected.device.type
            if actual.device.type != want:
                raise _Mismatch(f"{path}: result on {actual.device}, expected {want}")
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
                raise _Mismatch(f"{path}: {' '.join(str(e).split())[:300]}") from None
            return
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                raise _Mismatch(f"{path}: expected a {type(expected).__name__} of "
                                f"{len(expected)}, got {type(actual).__name__}")
            for i, (e, a) in enumerate(zip(expected, actual)):
                compare(e, a, f"{path}[{i}]", meta_only)
            return
        if isinstance(expected, dict):
            if not isinstance(actual, dict) or expected.keys() != actual.keys():
                raise _Mismatch(f"{path}: dict keys differ")
            for k in expected:
                compare(expected[k], actual[k], f"{path}[{k!r}]", meta_only)
            return
        if isinstance(expected, float) and isinstance(actual, float):
            if (math.isnan(expected) and math.isnan(actual)) or meta_only or \
                    math.isclose(actual, expected, rel_tol=RTOL, abs_tol=ATOL):
                return
            raise _Mismatch(f"{path}: {actual!r} != {expected!r}")
        if isinstance(expected, torch.device):
            if not isinstance(actual, torch.device) or actual.type != (
                    DEVICE if expected.type == "cpu" else expected.type):
                raise _Mismatch(f"{path}: {actual!r} (CPU run: {expected!r})")
            return
        if not meta_only and expected != actual:
            raise _Mismatch(f"{path}: {actual!r} != {expected!r}")

    def compare_args(expected, actual, path):
        """Compares the tensors among a sample's arguments after the call."""
        if isinstance(expected, torch.Tensor):
            if actual is not expected:  # not one kept on the CPU (_CPU_ARGS)
                compare(expected, actual, path + " (after the call)", False)
        elif isinstance(expected, (list, tuple)):
            for i, (e, a) in enumerate(zip(expected, actual)):
                compare_args(e, a, f"{path}[{i}]")
        elif isinstance(expected, dict):
            for k in expected:
                compare_args(expected[k], actual[k], f"{path}[{k!r}]")

    def error_text(e: BaseException) -> str:
        text = str(e).strip()
        first = text.splitlines()[0] if text else ""
        return f"{type(e).__name__}: {first[:300]}"

    def has_tensor(x) -> bool:
        if isinstance(x, torch.Tensor):
            return True
        if isinstance(x, (list, tuple)):
            return any(has_tensor(v) for v in x)
        if isinstance(x, dict):
            return any(has_tensor(v) for v in x.values())
        return False

    def run_sample(op, s, meta_only):
        """(status, error) of one sample."""
        if has_special((s.input, s.args, s.kwargs)):
            return "na", None
        try:
            mover = ToFlagos()
            f_input = mover(s.input)
            keep = _CPU_ARGS.get(op.name, ())
            f_args = tuple(a if j in keep else mover(a) for j, a in enumerate(s.args))
            f_kwargs = mover(s.kwargs)
        except _NotApplicable:
            return "na", None
        except Exception as e:  # noqa: BLE001
            return "fail", "copying the sample to flagos: " + error_text(e)
        try:
            torch.manual_seed(SEED)
            expected = op(s.input, *s.args, **s.kwargs)
        except Exception:  # noqa: BLE001
            return "cpu-skip", None
        if has_special(expected):
            return "na", None
        try:
            torch.manual_seed(SEED)
            if has_tensor((s.input, s.args, s.kwargs)):
                actual = op(f_input, *f_args, **f_kwargs)
            else:
                # A factory call with no device argument: its CPU run used the
                # default device, so the flagos run makes flagos the default.
                with torch.device(DEVICE):
                    actual = op(f_input, *f_args, **f_kwargs)
            compare(expected, actual, "result", meta_only)
            if not meta_only:
                compare_args(s.input, f_input, "input")
                compare_args(s.args, f_args, "args")
                compare_args(s.kwargs, f_kwargs, "kwargs")
        except _Mismatch as e:
            return "fail", str(e)
        except Exception as e:  # noqa: BLE001
            return "fail", error_text(e)
        return "pass", None

    def run_op(op, first, progress):
        """Runs the samples of op from index ``first``."""
        t0 = time.perf_counter()
        name = op.full_name
        meta_only = bool(op.has_nondeterministic_output)
        torch.manual_seed(zlib.crc32(name.encode()))
        gen_error, capped = None, False
        try:
            gen = op.sample_inputs("cpu", torch.float32, requires_grad=False)
            if max_samples is None:
                samples = list(gen)
            else:
                samples = list(itertools.islice(gen, max_samples + 1))
                capped = len(samples) > max_samples
                samples = samples[:max_samples]
        except Exception as e:  # noqa: BLE001
            samples, gen_error = [], error_text(e)
        for i, s in enumerate(samples):
            if i < first:
                continue
            progress.set(i)
            status, error = run_sample(op, s, meta_only)
            emit(kind="sample", op=name, i=i, status=status, error=error,
                 meta=meta_only)
        progress.set(-2)
        emit(kind="op", op=name, seconds=time.perf_counter() - t0,
             capped=capped, gen_error=gen_error)

    def run_ops(start_op, start_sample, progress):
        for k, op in enumerate(op_db):
            if k < start_op or k % stride != offset:
                continue
            name = op.full_name
            if only is not None and name not in only and op.name not in only:
                continue
            progress.set(-1, k)
            if torch.float32 not in op.supported_dtypes("cpu"):
                emit(kind="skip-op", op=name, why="no-float32")
                continue
            if name.startswith(_NA_PREFIXES) or any(w in name for w in _NA_WORDS):
                emit(kind="skip-op", op=name, why="na")
                continue
            run_op(op, start_sample if k == start_op else 0, progress)

    # The ops run in a child forked from this process, which has imported
    # everything but never initialised the flagos device (so the child may).
    # A sample that crashes or hangs the child costs only that sample: a new
    # child goes on at the next one.
    import mmap
    import struct

    class Progress:
        """(op index, sample index) of the child, in memory shared with it."""

        def __init__(self):
            self.buf = mmap.mmap(-1, 16)

        def get(self):
            return struct.unpack("qq", self.buf[:16])

        def set(self, i, k=None):
            if k is None:
                self.buf[8:16] = struct.pack("q", i)
            else:
                self.buf[:16] = struct.pack("qq", k, i)

    progress = Progress()
    k, i = start
    outside = 0
    while True:
        progress.set(-1, k)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_ops(k, i, progress)
            except BaseException:  # noqa: BLE001
                import traceback
                traceback.print_exc()
                code = 3
            sys.stdout.flush()
            os._exit(code)
        last, since = progress.get(), time.monotonic()
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            cur = progress.get()
            if cur != last:
                last, since = cur, time.monotonic()
            elif time.monotonic() - since > SAMPLE_TIMEOUT_S:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                status = None
                break
            time.sleep(0.005)
        if status == 0:
            break
        if status is None:
            why = f"timeout: no result in {SAMPLE_TIMEOUT_S}s"
        elif os.WIFSIGNALED(status):
            why = f"crash: killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            why = f"crash: exited with status {os.waitstatus_to_exitcode(status)}"
        k, i = progress.get()
        name = op_db[k].full_name
        emit(kind="crash")
        outside = outside + 1 if i < 0 else 0
        if outside >= 3:
            emit(kind="abort", error=f"3 crashes in a row outside any sample, "
                 f"the last at op {name}: {why}")
            return
        if i < 0:  # outside any sample: generating them, or after the last
            emit(kind="op", op=name, seconds=0.0, capped=False, gen_error=why)
            k, i = k + 1, 0
        else:
            emit(kind="sample", op=name, i=i, status="fail", error=why, meta=False)
            i += 1
    emit(kind="end")


# --------------------------------------------------------------------------
# the parent: starts workers, survives their crashes, aggregates


def _worker_env() -> dict:
    """The worker imports the torch_fl this process imports."""
    env = dict(os.environ)
    paths = []
    try:
        import torch_fl

        paths.append(os.path.dirname(os.path.dirname(os.path.abspath(torch_fl.__file__))))
    except ImportError:
        pass
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


class _Worker:
    def __init__(self, start, stride, offset, only, max_samples, verbose):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker",
               "--start", f"{start[0]}:{start[1]}",
               "--stride", str(stride), "--offset", str(offset),
               "--max-samples", str(max_samples or 0)]
        if only is not None:
            cmd += ["--ops", ",".join(sorted(only))]
        self.stride, self.offset = stride, offset
        self.only, self.max_samples, self.verbose = only, max_samples, verbose
        self.proc = subprocess.Popen(
            cmd, env=_worker_env(), stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if not verbose else None, text=True,
            bufsize=1)
        self.done = False


def run_sweep(only: set | None = None, max_samples: int = MAX_SAMPLES_PER_OP,
              workers: int | None = None, verbose: bool = False) -> Result:
    """Runs the sweep in worker processes and returns the aggregated result."""
    import queue
    import threading

    res = Result(max_samples=max_samples)
    t0 = time.monotonic()
    n = workers or max(1, min(4, os.cpu_count() or 1))
    lines: queue.Queue = queue.Queue()

    def pump(w: _Worker) -> None:
        for line in w.proc.stdout:
            lines.put((w, line))
        lines.put((w, None))

    live = []
    for j in range(n):
        w = _Worker((0, 0), n, j, only, max_samples, verbose)
        threading.Thread(target=pump, args=(w,), daemon=True).start()
        live.append(w)
    # The workers' children time out samples; this is only a backstop.
    backstop = 2 * SAMPLE_TIMEOUT_S + 60
    try:
        while live:
            try:
                w, line = lines.get(timeout=backstop)
            except queue.Empty:
                raise RuntimeError(f"opinfo workers silent for {backstop}s") from None
            if line is None:  # EOF: the worker exited
                rc = w.proc.wait()
                live.remove(w)
                if not w.done:
                    raise RuntimeError(f"opinfo worker {w.offset} died (status {rc}); "
                                       f"rerun with -v to see its stderr")
                continue
            if not line.startswith(_PREFIX):
                continue
            rec = json.loads(line[len(_PREFIX):])
            kind = rec["kind"]
            if kind == "end":
                w.done = True
            elif kind == "crash":
                res.crashes += 1
            elif kind == "abort":
                raise RuntimeError(f"opinfo worker {w.offset} gave up: {rec['error']}")
            else:
                if verbose and kind == "sample" and rec["status"] == "fail":
                    print(f"FAIL {rec['op']} [{rec['i']}] {rec['error']}", flush=True)
                if verbose and kind == "op":
                    print(f"op {rec['op']}: {rec['seconds']:.2f}s", flush=True)
                res.add(rec)
    finally:
        for w in live:
            w.proc.kill()
    # Workers interleave: report failures in a stable order.
    res.failures.sort(key=lambda f: (f.op, f.index))
    res.seconds = time.monotonic() - t0
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", help="comma-separated op names or full names (default: all)")
    p.add_argument("--max-samples", type=int, default=MAX_SAMPLES_PER_OP,
                   help="cap samples per op (default: none)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--slowest", type=int, default=0, help="list the N slowest ops")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--start", default="0:0", help=argparse.SUPPRESS)
    p.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    only = set(a.ops.split(",")) if a.ops else None
    if a.worker:
        k, i = (int(x) for x in a.start.split(":"))
        _worker_main((k, i), a.stride, a.offset, only, a.max_samples or None)
        return 0
    res = run_sweep(only, a.max_samples, a.workers, a.verbose)
    print("\n".join(res.failure_lines()))
    for name, err in res.sample_gen_errors:
        print(f"sample-generation error: {name}: {err}")
    for name, sec in sorted(res.op_seconds.items(), key=lambda kv: -kv[1])[:a.slowest]:
        print(f"slow: {name} {sec:.2f}s")
    print(res.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
