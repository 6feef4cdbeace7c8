"""OpInfo differential sweep: every float32 OpInfo sample, a reference device vs flagos.

The engine of tests/python/test_opinfo.py (see docs/opinfo.md). Also runs on
its own, with a per-sample report::

    PYTHONPATH=. .venv/bin/python tests/python/opinfo_sweep.py [--ref cpu|cuda] [--ops a,b] [-v]

The reference device (``--ref``) is ``cpu`` (the default; on the host driver
flagos runs the CPU's kernels, so results must agree to rounding) or ``cuda``
(on the cuda driver flagos runs PyTorch's CUDA kernels over zero-copy views,
so results must agree with native CUDA).

What is compared
----------------
For each OpInfo of PyTorch's ``op_db`` whose dtypes on the reference device
include float32, every sample of ``op.sample_inputs(REF, torch.float32)``
(optionally only the first ``--max-samples``; generated after
``torch.manual_seed(crc32(op name))``, so sample ``i`` of an op is the same in
every run) is

1. copied to flagos, before anything runs (an op that writes its inputs
   cannot change what the other side sees). The copy keeps each tensor's exact
   geometry: sizes, strides (0-strides of expanded tensors and overlap too),
   storage offset, and aliasing between tensors of one sample (tensors that
   share a storage share one flagos storage). Only tensors on the reference
   device move (with ``--ref cuda`` from a CPU staging copy, which also
   serves a second reference run); a CPU tensor in a cuda sample (a
   0-dim scalar, tensor_split's indices) stays on the CPU, as CUDA wants it.
   ``torch.device(REF)`` and ``"REF"`` arguments become flagos, generators of
   the reference device flagos ones in the same state. Arguments PyTorch wants
   on the CPU whatever the device (``_CPU_ARGS``) stay there;
2. run on the reference device after ``torch.manual_seed(SEED)``; if that
   raises (with cuda: also asynchronously, up to a synchronize), the sample is
   a "cpu-skip" / "cuda-skip" and not counted;
3. run on flagos after the same ``torch.manual_seed(SEED)``. The flagos
   generator is the reference's (host driver: CPU's mt19937; cuda driver: the
   CUDA default generator itself), seeded by ``torch.manual_seed``, so random
   ops (rand*, normal, bernoulli, dropout, multinomial, ...) give the
   reference's numbers and are compared in full. A sample without any tensor
   (a factory call such as ``arange(3)``) runs under ``torch.device("flagos")``
   (and, with cuda, its reference run under ``torch.device("cuda")``);
4. compared: every result tensor must be a flagos tensor with the reference
   result's dtype, shape and values (``torch.testing.assert_close``,
   ``equal_nan``, rtol 1.3e-6 / atol 1e-5; with ``--ref cuda`` widened, per
   op, to OpInfo's float32 tolerance overrides that apply to cuda eager
   comparisons); non-tensor results with ``==`` (floats with the same
   tolerances); and the sample's tensor arguments afterwards (in-place and
   out= writes must reach the flagos tensors the caller holds).

Variants
--------
By default each op is called as OpInfo's function. ``--variants`` (its
default ``FLAGOS_SWEEP_VARIANTS``, else ``function``) also sweeps its in-place
form (``inplace``: ``op.inplace_variant``, named ``<op>_``) and its ``out=``
form (``out``: the function's results tell the dtypes, then the op runs again
into zero-size tensors of those dtypes, which it must resize; named
``<op>(out=)``; ops whose OpInfo says ``supports_out``). A sample the
reference refuses in that form (an in-place op whose result would broadcast
or promote beyond ``self``) is a "cpu-skip" / "cuda-skip". ``errors`` runs
OpInfo's error inputs (``op.error_inputs``, made on flagos; named
``<op>(errors)``, in the first dtype only): each must raise the error type
OpInfo names, with a message its pattern matches, as PyTorch's own
``test_errors`` asks of every device. One the reference does not raise so
(the same error input made on the reference device) is a "cpu-skip".

Ops whose output is uninitialised memory (``empty*``: OpInfo's
``has_nondeterministic_output``) are compared on shape, dtype and device only
("meta-only"). With ``--ref cuda``, a sample whose flagos result differs is
run on cuda a second time (same seed, a fresh copy of the sample): if CUDA
disagrees with itself (atomics, nondeterministic kernels), the sample is
compared on shape, dtype and device only as well and counted as
"nondeterministic". Sparse, quantized and nested-tensor ops, and samples with a
non-strided tensor in or out, are "not applicable" (flagos is a strided-only
device) and counted apart.

Crash isolation
---------------
Worker processes (ops dealt round-robin; one intra-op thread each) run the ops
in a child process. A sample that kills the child (a segfault, an abort) or
runs past ``SAMPLE_TIMEOUT_S`` is a failure of that sample ("crash: ..." /
"timeout: ..."), and a new child goes on at the next sample. With the CPU
reference on the host driver the worker imports op_db once, without
initialising the device, and forks each child ("fork" isolation). CUDA cannot
be used in a child forked after CUDA was initialised (and importing op_db or
torch_fl on a GPU machine initialises it), so with cuda, or on any driver but
host, each child is a fresh interpreter ("spawn" isolation; a crash costs one
import of op_db). A CUDA error that leaves the context unusable (a device-side
assert, an illegal address) is charged to the sample that raised it, and a new
child goes on at the next sample.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import mmap
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from typing import Any

DEVICE = "flagos"
SEED = 1234
REFS = ("cpu", "cuda")
# Optional deterministic cap: the first N samples of each op, in OpInfo's
# order. None: every sample (the CPU sweep takes 20-50 s on 2 cores).
MAX_SAMPLES_PER_OP = None
# The cap with the cuda reference: see docs/opinfo.md for its runtime.
MAX_SAMPLES_CUDA = None
RTOL = 1.3e-6
ATOL = 1e-5
# Base (rtol, atol) by dtype; OpInfo's overrides for the dtype widen them with
# --ref cuda. float32 is the CPU sweep's. Two correct implementations of a
# bfloat16 / float16 op may each round differently (an fp32 accumulator in
# another order, then one rounding of the output): rtol is two units in the
# last place of the format (bf16 2^-7 ~ 7.8e-3, f16 2^-10 ~ 9.8e-4), atol
# covers results that cancel towards zero.
TOLERANCES = {
    "float32": (RTOL, ATOL),
    "bfloat16": (1.6e-2, 1e-2),
    "float16": (2e-3, 1e-3),
}
DTYPES = tuple(TOLERANCES)
# The providers the flagos runs use with --ref cuda: "native" (flaggems off:
# flagos must equal native CUDA) or "flaggems" (the default routing, with
# FlagGems on; each sample's failure is traced to the FlagGems kernel(s)
# that cause it).
PROVIDERS = ("native", "flaggems")
# aten operators whose FlagGems kernels draw random numbers from FlagGems'
# own Philox streams, not from the CUDA generator's sequence: their samples
# are compared on shape, dtype and device only ("random").
_FLAGGEMS_RANDOM = {
    "bernoulli_.float", "bernoulli_.Tensor", "bernoulli", "normal_", "normal.Tensor_float",
    "normal.Tensor_Tensor", "normal.float_Tensor", "uniform_", "exponential_",
    "multinomial", "native_dropout", "rand_like", "randn_like", "randperm",
    "rrelu_with_noise",
}
SAMPLE_TIMEOUT_S = 120
# With FlagGems a sample may first compile and autotune Triton kernels.
SAMPLE_TIMEOUT_FLAGGEMS_S = 400

# Ops that are not applicable to a strided-only device.
_NA_PREFIXES = ("sparse.", "to_sparse", "_sparse", "nested", "_nested")
_NA_WORDS = ("sparse", "nested", "quantized")

# Positional arguments that PyTorch requires on the CPU whatever the device
# (OpInfo makes them CPU tensors for CUDA too): they are not moved.
_CPU_ARGS = {
    "tensor_split": (0,),  # tensor_indices_or_sections
}

# Ops whose output is not a function of their inputs (uninitialised memory,
# nondeterministic fused kernels): these, and those OpInfo's
# ``has_nondeterministic_output`` marks where this torch has it.
_NONDETERMINISTIC_OUTPUT = {
    "empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
    "new_empty_strided", "torch.ops.aten._efficient_attention_forward",
    "torch.ops.aten._flash_attention_forward",
}

# How an op is called (module docstring, "Variants"): its name suffix by variant.
VARIANTS = {"function": "", "inplace": "_", "out": "(out=)", "errors": "(errors)"}

_PREFIX = "@@opinfo "
# A child's exit status meaning: the CUDA context is unusable after a sample
# that has been reported; go on in a new child at the sample that progress
# names, without charging anything.
_RESTART = 75


def default_max_samples(ref: str) -> int | None:
    """The per-op sample cap the sweep uses against ``ref`` unless told."""
    return MAX_SAMPLES_CUDA if ref == "cuda" else MAX_SAMPLES_PER_OP


# --------------------------------------------------------------------------
# results (parent side)


@dataclasses.dataclass
class Failure:
    op: str
    index: int
    error: str


@dataclasses.dataclass
class GemsCell:
    """One FlagGems operator in one dtype, over the samples that ran it."""
    passed: int = 0
    failed: int = 0
    random: int = 0  # random operators: compared on shape, dtype and device
    errors: list = dataclasses.field(default_factory=list)  # (OpInfo label, i, error)


@dataclasses.dataclass
class Result:
    passed: int = 0
    compared: int = 0
    cpu_skip: int = 0                # the reference run raised (cpu or cuda)
    not_applicable: int = 0          # samples
    meta_only: int = 0               # compared on shape/dtype/device only
    ops_run: int = 0
    na_ops: list = dataclasses.field(default_factory=list)
    no_float32_ops: list = dataclasses.field(default_factory=list)
    no_variant_ops: list = dataclasses.field(default_factory=list)  # no in-place / out= form
    sample_gen_errors: list = dataclasses.field(default_factory=list)
    capped_ops: list = dataclasses.field(default_factory=list)
    failures: list = dataclasses.field(default_factory=list)
    nondeterministic: list = dataclasses.field(default_factory=list)  # (op, i)
    op_seconds: dict = dataclasses.field(default_factory=dict)
    crashes: int = 0
    seconds: float = 0.0
    max_samples: int | None = None
    ref: str = "cpu"
    workers: int = 0
    provider: str = "native"
    # provider flaggems: (aten op, dtype) -> GemsCell, and the failures that
    # remain with every operator on cuda (not FlagGems').
    gems: dict = dataclasses.field(default_factory=dict)
    unattributed: list = dataclasses.field(default_factory=list)  # see _add_gems
    grad_compared: int = 0  # provider flaggems: backward runs
    grad_passed: int = 0
    not_flaggems: list = dataclasses.field(default_factory=list)

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
        head = "OpInfo sweep" if self.ref == "cpu" else f"OpInfo sweep (flagos vs {self.ref})"
        nondet = (f" ({len(self.nondeterministic)} nondeterministic on {self.ref})"
                  if self.ref != "cpu" else "")
        forms = f"{len(self.no_variant_ops)} ops without the form, " if self.no_variant_ops else ""
        return (
            f"{head}: {self.passed} passed / {self.compared} compared "
            f"({pct:.2f}%), {len(self.failures)} failed in "
            f"{len(self.failed_ops)} ops, {self.cpu_skip} {self.ref}-skip, "
            f"{self.meta_only} meta-only{nondet}, {self.not_applicable} not-applicable "
            f"samples; {self.ops_run} ops run, {len(self.na_ops)} ops not "
            f"applicable, {len(self.no_float32_ops)} ops without the dtype, {forms}"
            f"{capped}{len(self.sample_gen_errors)} sample-generation errors, "
            f"{self.crashes} crashes/timeouts; {self.seconds:.0f}s"
        )

    def failure_lines(self) -> list[str]:
        """``op [sample indices] error``, one line per op and distinct error."""
        groups: dict = {}
        for f in self.failures:
            groups.setdefault((f.op, f.error), []).append(f.index)
        return [f"  {op} {idx} {err}" for (op, err), idx in groups.items()]

    def nondeterministic_lines(self) -> list[str]:
        """``op [sample indices]`` of samples whose reference varied between runs."""
        groups: dict = {}
        for op, i in self.nondeterministic:
            groups.setdefault(op, []).append(i)
        return [f"  {op} {idx}" for op, idx in sorted(groups.items())]

    def _gems(self, op: str, dtype: str) -> GemsCell:
        return self.gems.setdefault((op, dtype), GemsCell())

    def _add_gems(self, rec: dict) -> None:
        """Charges a sample's outcome to the FlagGems operators it ran."""
        used = rec.get("used") or []
        dt = rec.get("dtype", "float32")
        where = (rec["op"] + (" backward" if rec["kind"] == "grad" else ""), rec["i"])
        if rec["status"] == "pass":
            for u in used:
                cell = self._gems(u, dt)
                if rec.get("random"):
                    cell.random += 1
                else:
                    cell.passed += 1
            return
        if "without_flaggems" in rec:
            self.not_flaggems.append((*where, rec["without_flaggems"]))
            return
        culprits = rec.get("culprits")
        if culprits and len(culprits) == len(used) >= 3 and len({c[1] for c in culprits}) == 1:
            # Every operator alone gives the very same failure, exact ones
            # (neg, zero_) included: it is not one kernel's arithmetic but the
            # computation's sensitivity to something every route change moves
            # (allocation addresses that pick a cuBLAS/cuSOLVER variant).
            self.unattributed.append((*where, rec["error"], list(used)))
            return
        if culprits:
            for u, err in culprits:
                cell = self._gems(u, dt)
                cell.failed += 1
                cell.errors.append((*where, err))
            for u in set(used) - {c[0] for c in culprits}:
                self._gems(u, dt).passed += 1  # right on its own in this sample
            return
        for u in used:  # wrong only together (or not traced): charged to each
            cell = self._gems(u, dt)
            cell.failed += 1
            together = f" (fails only with {', '.join(used)} together)" if culprits == [] else ""
            cell.errors.append((*where, rec["error"] + together))

    def gems_ops(self) -> dict:
        """aten op -> {dtype: GemsCell}, for the operators FlagGems ran."""
        out: dict = {}
        for (op, dt), cell in self.gems.items():
            out.setdefault(op, {})[dt] = cell
        return dict(sorted(out.items()))

    def gems_failed_ops(self) -> dict:
        """aten op -> [(dtype, OpInfo label, sample, error)] of FlagGems' failures."""
        out: dict = {}
        for op, cells in self.gems_ops().items():
            for dt, cell in cells.items():
                for label, i, err in cell.errors:
                    out.setdefault(op, []).append((dt, label, i, err))
        return out

    def gems_table(self, registered: list, dtypes: tuple) -> str:
        """The markdown pass table: one row per registered FlagGems operator."""
        ops = self.gems_ops()
        head = "| operator | " + " | ".join(dtypes) + " |"
        lines = [head, "|---" * (len(dtypes) + 1) + "|"]
        for op in sorted(set(registered) | set(ops)):
            cells = ops.get(op, {})
            row = []
            for dt in dtypes:
                c = cells.get(dt)
                if c is None:
                    row.append("not reached")
                elif c.failed:
                    row.append(f"**fail** {c.failed}/{c.failed + c.passed}")
                elif c.passed:
                    row.append(f"pass {c.passed}" + (f" (+{c.random} shape)" if c.random else ""))
                else:
                    row.append(f"random: shape {c.random}")
            lines.append(f"| `{op}` | " + " | ".join(row) + " |")
        return "\n".join(lines)

    def gems_summary(self, registered: list) -> str:
        ops = self.gems_ops()
        reached = [op for op in registered if op in ops]
        failing = sorted(self.gems_failed_ops())
        return (f"FlagGems: {len(registered)} operators registered, {len(reached)} reached by "
                f"OpInfo samples ({len(set(ops) - set(registered))} more reached through "
                f"other overloads), {len(failing)} failing: {', '.join(failing) or 'none'}; "
                f"{len(self.unattributed)} failing samples no single operator explains; "
                f"{len(self.not_flaggems)} failing samples not FlagGems' (fail with every "
                f"operator on cuda too)")

    def gems_report(self, registered: list, per_op: int = 3) -> list[str]:
        """The FlagGems summary, backward count, and the failures, per_op at
        most for each operator."""
        lines = [self.gems_summary(registered),
                 f"backward runs: {self.grad_passed} passed / {self.grad_compared} compared"]
        for op, fails in self.gems_failed_ops().items():
            for dt, label, i, err in fails[:per_op]:
                lines.append(f"  FlagGems {op} [{dt}] in {label}[{i}]: {err}")
        for label, i, err, used in self.unattributed:
            lines.append(f"  unattributed (each of {', '.join(used)} alone fails alike): "
                         f"{label}[{i}]: {err}")
        for label, i, err in self.not_flaggems[:50]:
            lines.append(f"  not FlagGems' (fails with every operator on cuda too): "
                         f"{label}[{i}]: {err}")
        return lines

    def add(self, rec: dict) -> None:
        kind = rec["kind"]
        if kind in ("sample", "grad") and self.provider == "flaggems" and \
                rec["status"] in ("pass", "fail"):
            self._add_gems(rec)
        if kind == "grad":
            self.grad_compared += 1
            self.grad_passed += rec["status"] == "pass"
        elif kind == "sample":
            st = rec["status"]
            if st == "cpu-skip":
                self.cpu_skip += 1
            elif st == "na":
                self.not_applicable += 1
            else:
                self.compared += 1
                self.meta_only += bool(rec.get("meta"))
                if rec.get("nondet"):
                    self.nondeterministic.append((rec["op"], rec["i"]))
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
            by_why = {"na": self.na_ops, "no-variant": self.no_variant_ops}
            by_why.get(rec["why"], self.no_float32_ops).append(rec["op"])


# --------------------------------------------------------------------------
# the worker: runs samples and prints one line per event


def ensure_expecttest() -> None:
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


class _ContextLost(Exception):
    """The CUDA context is unusable; the sample that broke it is reported."""


def _emit(**rec) -> None:
    sys.stdout.write(_PREFIX + json.dumps(rec) + "\n")
    sys.stdout.flush()


class _Progress:
    """(op index, sample index, op name) of the running child, in memory shared
    with it: an anonymous mapping a forked child inherits, or a file that a
    spawned child maps."""

    SIZE = 256

    def __init__(self, path: str | None = None):
        if path is None:
            self.buf = mmap.mmap(-1, self.SIZE)
        else:
            with open(path, "r+b") as f:
                self.buf = mmap.mmap(f.fileno(), self.SIZE)

    @classmethod
    def new_file(cls) -> str:
        fd, path = tempfile.mkstemp(prefix="opinfo-progress-")
        os.write(fd, b"\0" * cls.SIZE)
        os.close(fd)
        return path

    def get(self) -> tuple[int, int]:
        return struct.unpack("qq", self.buf[:16])

    def name(self) -> str:
        (n,) = struct.unpack("q", self.buf[16:24])
        return self.buf[24:24 + n].decode(errors="replace")

    def set(self, i: int, k: int | None = None, name: str | None = None) -> None:
        if k is None:
            self.buf[8:16] = struct.pack("q", i)
            return
        if name is not None:
            raw = name.encode()[: self.SIZE - 24]
            self.buf[16:24 + len(raw)] = struct.pack("q", len(raw)) + raw
        self.buf[:16] = struct.pack("qq", k, i)


def _label(name: str, dtype: str, dtypes: tuple) -> str:
    """How results name an op: its OpInfo name, with the dtype when several
    dtypes are swept (``mul[bfloat16]``)."""
    return name if dtypes == ("float32",) else f"{name}[{dtype}]"


def _names(what: str, names, allowed) -> tuple:
    """``names`` (a comma-separated string or a sequence) as a tuple, each one
    of ``allowed``; else ValueError naming the bad ones and the choices."""
    if isinstance(names, str):
        names = names.split(",")
    names = tuple(n.strip() for n in names if n.strip())
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"{what} {bad or '(none)'}: choose from {', '.join(allowed)}")
    return names


class _Variant:
    """An OpInfo called in its in-place or out= form: the sweep's machinery
    reads the OpInfo's attributes through it and calls it as the op. Variants
    are compared forward only."""

    supports_autograd = False

    def __init__(self, op, kind: str):
        # ``name`` stays the OpInfo's (the sweep's per-op tables key on it).
        self._op, self.kind = op, kind
        self.full_name = op.full_name + VARIANTS[kind]

    def __getattr__(self, name):
        return getattr(self._op, name)

    def __call__(self, inp, *args, **kwargs):
        import torch

        if self.kind == "inplace":
            return self._op.inplace_variant(inp, *args, **kwargs)
        if self.kind == "errors":
            return self._op(inp, *args, **kwargs)
        res = self._op(inp, *args, **kwargs)
        if isinstance(res, torch.Tensor):
            out = torch.empty(0, dtype=res.dtype, device=res.device)
        elif isinstance(res, tuple) and res and all(isinstance(r, torch.Tensor) for r in res):
            out = tuple(torch.empty(0, dtype=r.dtype, device=r.device) for r in res)
        else:
            raise TypeError(f"{self._op.name} returns {type(res).__name__}: no out= form to sweep")
        return self._op(inp, *args, **kwargs, out=out)

    @staticmethod
    def of(op, kind: str):
        """The op in form ``kind``, or None when OpInfo says it has none."""
        if kind == "function":
            return op
        if kind == "inplace":
            return _Variant(op, kind) if op.inplace_variant is not None else None
        if kind == "errors":
            return _Variant(op, kind) if op.error_inputs_func is not None else None
        return _Variant(op, kind) if op.supports_out else None


def _load_runner(stride: int, offset: int, only: set | None,
                 max_samples: int | None, ref: str,
                 dtypes: tuple = ("float32",), provider: str = "native", seed: int = 0,
                 variants: tuple = ("function",)):
    """Imports torch, torch_fl and op_db; returns ``run_ops(k, i, progress)``,
    which runs this worker's (op, form, dtype) triples from pair index ``k``
    (``(op index * forms + form index) * dtypes + dtype index``), sample ``i``."""
    import itertools
    import warnings

    warnings.simplefilter("ignore")
    ensure_expecttest()
    import torch
    import torch_fl  # noqa: F401  registers the flagos device
    from torch.testing._internal.common_methods_invocations import op_db

    torch.set_num_threads(1)
    REF = ref
    on_cuda = REF == "cuda"
    attribute = provider == "flaggems"
    if attribute and not torch_fl.is_flaggems_enabled():
        raise RuntimeError("provider 'flaggems': FlagGems is not enabled here "
                           "(needs the cuda driver and flag_gems)")
    routing = torch_fl.routing
    refereed_dtypes = (torch.float32, torch.bfloat16, torch.float16)  # see refereed()

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

    def is_ref_device_str(x) -> bool:
        return isinstance(x, str) and (x == REF or x.startswith(REF + ":"))

    # A sample is first taken apart into a template: each tensor on the
    # reference device becomes (storage, offset, sizes, strides) over a staging
    # copy of its storage's bytes, the rest is kept. build() then makes the
    # sample on any device, as often as needed: flagos for the comparison, and
    # with cuda, a fresh reference copy for a second reference run.
    class _T:
        __slots__ = ("key", "dtype", "offset", "size", "stride", "dense", "rg")

    class _Gen:
        __slots__ = ("state",)

        def __init__(self, state):
            self.state = state

    class Template:
        def __init__(self, sample, keep_args=()):
            # CPU reference: the staging is the sample's own storage, read at
            # once by build(DEVICE) before anything runs. cuda: a CPU copy,
            # which also serves later builds.
            self.staging = {}
            self.input = self.take(sample.input)
            self.args = tuple(a if j in keep_args else self.take(a)
                              for j, a in enumerate(sample.args))
            self.kwargs = self.take(sample.kwargs)

        def take_tensor(self, t):
            if is_special(t):
                raise _NotApplicable(f"{t.layout} input")
            if t.device.type != REF:
                return t  # kept: a CPU tensor in a cuda sample
            rec = _T()
            rec.dtype = t.dtype
            rec.rg = t.requires_grad
            if t.is_conj() or t.is_neg():
                # (float32 samples have none) keep it simple: a plain copy.
                rec.dense = t.resolve_conj().resolve_neg().cpu().clone()
                return rec
            rec.dense = None
            st = t.untyped_storage()
            key = st.data_ptr() if st.nbytes() else id(st)
            if key not in self.staging:
                raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(st)
                self.staging[key] = raw.cpu() if on_cuda else raw
            rec.key, rec.offset = key, t.storage_offset()
            rec.size, rec.stride = tuple(t.size()), tuple(t.stride())
            return rec

        def take(self, x):
            if isinstance(x, torch.Tensor):
                return self.take_tensor(x)
            if isinstance(x, torch.Generator) and x.device.type == REF:
                return _Gen(x.get_state())
            if isinstance(x, tuple) and hasattr(x, "_fields"):
                return type(x)(*(self.take(v) for v in x))
            if isinstance(x, (list, tuple)):
                return type(x)(self.take(v) for v in x)
            if isinstance(x, dict):
                return {k: self.take(v) for k, v in x.items()}
            return x

        def build(self, dev, grad=False):
            """(input, args, kwargs) on device type ``dev``; with ``grad``,
            the tensors the sample made require grad are leaves that do."""
            storages = {}

            def go(x):
                if isinstance(x, _T):
                    out = leaf(x)
                    return out.requires_grad_() if grad and x.rg else out
                return other(x)

            def leaf(x):
                if x.dense is not None:
                    return x.dense.to(dev)
                st = storages.get(x.key)
                if st is None:
                    st = storages[x.key] = self.staging[x.key].to(dev).untyped_storage()
                out = torch.empty(0, dtype=x.dtype, device=dev)
                out.set_(st, x.offset, x.size, x.stride)
                return out

            def other(x):
                if isinstance(x, _Gen):
                    g = torch.Generator(device=dev)
                    g.set_state(x.state)
                    return g
                if isinstance(x, torch.device) and x.type == REF:
                    return torch.device(dev, x.index) if x.index is not None else torch.device(dev)
                if is_ref_device_str(x):  # device="cpu", x.to("cuda:0")
                    return dev + x[len(REF):]
                if isinstance(x, tuple) and hasattr(x, "_fields"):
                    return type(x)(*(go(v) for v in x))
                if isinstance(x, (list, tuple)):
                    return type(x)(go(v) for v in x)
                if isinstance(x, dict):
                    return {k: go(v) for k, v in x.items()}
                return x

            return go(self.input), go(self.args), go(self.kwargs)

    def compare(expected, actual, path, meta_only, tol, dev=DEVICE):
        """Raises _Mismatch unless ``actual`` (a run on ``dev``) matches ``expected``
        (the reference run)."""
        rtol, atol = tol
        if isinstance(expected, torch.Tensor):
            if not isinstance(actual, torch.Tensor):
                raise _Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
            want = dev if expected.device.type == REF else expected.device.type
            if actual.device.type != want:
                raise _Mismatch(f"{path}: result on {actual.device}, expected {want}")
            if expected.layout != actual.layout:
                raise _Mismatch(f"{path}: layout {actual.layout} != {expected.layout}")
            act = actual.cpu()
            exp = expected.cpu()
            if meta_only:
                if act.shape != exp.shape or act.dtype != exp.dtype:
                    raise _Mismatch(f"{path}: {act.dtype}{list(act.shape)} != "
                                    f"{exp.dtype}{list(exp.shape)}")
                return
            try:
                torch.testing.assert_close(act, exp, rtol=rtol, atol=atol,
                                           equal_nan=True, check_device=False)
            except AssertionError as e:
                raise _Mismatch(f"{path}: {' '.join(str(e).split())[:300]}") from None
            return
        if isinstance(expected, (list, tuple)):
            if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
                raise _Mismatch(f"{path}: expected a {type(expected).__name__} of "
                                f"{len(expected)}, got {type(actual).__name__}")
            for i, (e, a) in enumerate(zip(expected, actual)):
                compare(e, a, f"{path}[{i}]", meta_only, tol, dev)
            return
        if isinstance(expected, dict):
            if not isinstance(actual, dict) or expected.keys() != actual.keys():
                raise _Mismatch(f"{path}: dict keys differ")
            for k in expected:
                compare(expected[k], actual[k], f"{path}[{k!r}]", meta_only, tol, dev)
            return
        if isinstance(expected, float) and isinstance(actual, float):
            if (math.isnan(expected) and math.isnan(actual)) or meta_only or \
                    math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol):
                return
            raise _Mismatch(f"{path}: {actual!r} != {expected!r}")
        if isinstance(expected, torch.device):
            if not isinstance(actual, torch.device) or actual.type != (
                    dev if expected.type == REF else expected.type):
                raise _Mismatch(f"{path}: {actual!r} ({REF} run: {expected!r})")
            return
        if not meta_only and expected != actual:
            raise _Mismatch(f"{path}: {actual!r} != {expected!r}")

    def compare_args(expected, actual, path, tol, dev=DEVICE):
        """Compares the tensors among a sample's arguments after the call."""
        if isinstance(expected, torch.Tensor):
            if actual is not expected:  # not one kept as it was (_CPU_ARGS, CPU in cuda)
                compare(expected, actual, path + " (after the call)", False, tol, dev)
        elif isinstance(expected, (list, tuple)):
            for i, (e, a) in enumerate(zip(expected, actual)):
                compare_args(e, a, f"{path}[{i}]", tol, dev)
        elif isinstance(expected, dict):
            for k in expected:
                compare_args(expected[k], actual[k], f"{path}[{k!r}]", tol, dev)

    def compare_all(expected, sample, actual, built, meta_only, tol, dev=DEVICE):
        compare(expected, actual, "result", meta_only, tol, dev)
        if not meta_only:
            compare_args(sample.input, built[0], "input", tol, dev)
            compare_args(sample.args, built[1], "args", tol, dev)
            compare_args(sample.kwargs, built[2], "kwargs", tol, dev)

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

    def call(op, built, dev, factory):
        torch.manual_seed(SEED)
        if factory and dev != "cpu":
            # A factory call with no device argument: the CPU run would use the
            # default device, so the run makes ``dev`` the default.
            with torch.device(dev):
                return op(built[0], *built[1], **built[2])
        return op(built[0], *built[1], **built[2])

    def tolerance(op, dtype):
        """(rtol, atol) for op in ``dtype``: TOLERANCES', widened with cuda to
        OpInfo's overrides for the dtype that apply to eager cuda comparisons
        (undecorated overrides, and DecorateInfo ones for every test class or
        TestCommon, for every device or cuda)."""
        rtol, atol = TOLERANCES[str(dtype).removeprefix("torch.")]
        if not on_cuda:
            return rtol, atol
        from torch.testing._internal.common_device_type import (
            precisionOverride, toleranceOverride)

        def widen(dec):
            nonlocal rtol, atol
            if isinstance(dec, toleranceOverride) and dtype in dec.d:
                t = dec.d[dtype]
                rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
            elif isinstance(dec, precisionOverride) and dtype in dec.d:
                atol = max(atol, dec.d[dtype])

        for d in getattr(op, "decorators", None) or ():
            inner = getattr(d, "decorators", None)
            if inner is None:  # a bare decorator: every test, every device
                widen(d)
                continue
            if getattr(d, "device_type", None) not in (None, REF):
                continue
            if getattr(d, "cls_name", None) not in (None, "TestCommon"):
                continue
            if "mps" in (getattr(d, "test_name", None) or ""):
                continue
            dtypes = getattr(d, "dtypes", None)
            if dtypes is not None and dtype not in dtypes:
                continue
            if not getattr(d, "active_if", True):
                continue
            for dec in inner:
                widen(dec)
        return rtol, atol

    def flaggems_used() -> list:
        """The aten operators that ran on FlagGems since the last reset."""
        return sorted(st.op.removeprefix("aten::") for st in routing.stats()
                      if routing.flaggems_calls(st.calls))

    def is_random(used) -> bool:
        return any(u in _FLAGGEMS_RANDOM or u.split(".")[0] in _FLAGGEMS_RANDOM
                   for u in used)

    @contextlib.contextmanager
    def on_cuda_but(gems=None):
        """Every operator on cuda's kernels, except ``gems`` on FlagGems."""
        routing.set_route("*", "cuda")
        if gems:
            routing.set_route(gems, "flaggems")
        try:
            yield
        finally:
            if gems:
                routing.set_route(gems, "")
            routing.set_route("*", "")

    def failure(fn) -> str | None:
        """None when ``fn()`` runs and its comparison holds, else the error text."""
        try:
            fn()
        except _Mismatch as e:
            return str(e)
        except Exception as e:  # noqa: BLE001
            return error_text(e)
        return None

    def culprits_of(check, used) -> list:
        """[operator, error] of each FlagGems operator that alone (every other
        operator on cuda) makes ``check()`` fail."""
        out = []
        for u in used:
            with on_cuda_but(u):
                err = failure(check)
            if err is not None:
                out.append([u, err])
        return out

    def trace(op, s, tmpl, expected, factory, meta_only, tol, used) -> dict:
        """Which FlagGems kernels a failing sample's failure comes from: the
        sample runs again with every operator on cuda (a failure then is not
        FlagGems'), then with one FlagGems operator at a time."""
        def replay():
            built = tmpl.build(DEVICE)
            compare_all(expected, s, call(op, built, DEVICE, factory), built, meta_only, tol)

        with on_cuda_but():
            err = failure(replay)
        if err is not None:
            return {"without_flaggems": err}
        return {"culprits": culprits_of(replay, used)}

    def wants_grad(op, dtype) -> bool:
        """Backward runs: provider flaggems, differentiable ops, float dtypes."""
        return (attribute and op.supports_autograd and dtype.is_floating_point
                and dtype in op.supported_backward_dtypes(REF))

    def flat(x):
        if isinstance(x, torch.Tensor):
            yield x
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from flat(v)
        elif isinstance(x, dict):
            for v in x.values():
                yield from flat(v)

    def upcast(x, lowp):
        """x with every ``lowp`` tensor in float64 (leaves stay leaves)."""
        if isinstance(x, torch.Tensor):
            if x.dtype != lowp:
                return x
            return x.detach().double().requires_grad_(x.requires_grad)
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            return type(x)(upcast(v, lowp) for v in x)
        if isinstance(x, dict):
            return {k: upcast(v, lowp) for k, v in x.items()}
        return x

    def grads(op, tmpl, factory, lowp=None):
        """Forward and backward of a fresh flagos copy of the sample under the
        routes in force: the gradients of its leaves for a seeded cotangent,
        or None when nothing is differentiable. With ``lowp``, its tensors run
        in float64 (the referee)."""
        built = tmpl.build(DEVICE, grad=True)
        if lowp is not None:
            built = upcast(built, lowp)
        leaves = [t for t in flat(built) if t.requires_grad]
        if not leaves:
            return None
        out = call(op, built, DEVICE, factory)
        outs = [o for o in flat(out) if o.requires_grad]
        if not outs:
            return None
        g = torch.Generator().manual_seed(SEED)
        cots = [torch.randn(o.shape, generator=g).to(o.dtype if lowp is None else lowp)
                .to(o.dtype).to(o.device) for o in outs]
        return list(torch.autograd.grad(outs, leaves, cots, allow_unused=True))

    def closer(got, ref, exact, lowp) -> bool:
        """Whether each of ``got`` is no further from ``exact`` than ``ref``
        (see refereed())."""
        triples = list(zip(got, ref, exact))
        if len(triples) != len(ref):
            return False
        for fg, cu, ex in triples:
            if fg is None or cu is None or ex is None:
                if not (fg is None and cu is None):
                    return False
                continue
            if not cu.dtype.is_floating_point:
                if not torch.equal(cu.cpu(), fg.cpu()):
                    return False
                continue
            ex, cu, fg = ex.double().cpu(), cu.double().cpu(), fg.double().cpu()
            if cu.shape != fg.shape or cu.shape != ex.shape:
                return False
            finite = ex.isfinite()
            if not torch.equal(finite, fg.isfinite()) or not torch.equal(
                    ex[~finite].isnan(), fg[~finite].isnan()):
                return False
            if not finite.any():
                continue
            err_cu = (cu - ex)[finite].abs().max().item()
            err_fg = (fg - ex)[finite].abs().max().item()
            scale = ex[finite].abs().max().item()
            if err_fg > max(2 * err_cu, 2 * torch.finfo(lowp).eps * scale):
                return False
        return True

    def run_grad(op, s, dtype, tol) -> dict | None:
        """Backward of a sample: the default routing (FlagGems) against every
        operator on cuda, which runs native CUDA's kernels (a backward on CUDA
        tensors is not possible in a process with a PrivateUse1 backend,
        pytorch#161129). The record, or None when the sample has no backward
        the cuda run can do."""
        try:
            tmpl = Template(s, _CPU_ARGS.get(op.name, ()))
            factory = not has_tensor((s.input, s.args, s.kwargs))
            with on_cuda_but():
                want = grads(op, tmpl, factory)
            if want is None:
                return None
        except Exception:  # noqa: BLE001  (no backward on cuda either: not compared)
            return None

        lowp = dtype if dtype in refereed_dtypes else None

        def check():
            got = grads(op, tmpl, factory)
            try:
                compare(want, got, "grad", False, tol)
            except _Mismatch:
                if lowp is None or not refereed_grads(got):
                    raise

        def refereed_grads(got) -> bool:
            try:
                with on_cuda_but():
                    exact = grads(op, tmpl, factory, lowp)
            except Exception:  # noqa: BLE001
                return False
            return exact is not None and closer(got, want, exact, lowp)

        def varies() -> bool:
            """Whether the cuda run disagrees with itself (atomics)."""
            with on_cuda_but():
                return failure(lambda: compare(want, grads(op, tmpl, factory), "grad", False,
                                               tol)) is not None

        routing.reset_stats()
        err = failure(check)
        used = flaggems_used()
        if is_random(used):
            return None
        if err is None:
            return {"status": "pass", "error": None, "used": used}
        if varies():
            return None  # not comparable: the reference itself varies
        return {"status": "fail", "error": err, "used": used, "culprits": culprits_of(check, used)}

    def refereed(op, s, tmpl, expected, actual, factory) -> bool:
        """A result that differs from CUDA's beyond the tolerance passes when
        it is no further from the float64 result than CUDA's own (twice CUDA's
        largest error, or two units of the format at the result's scale): two
        correct kernels that accumulate in another order round differently,
        which no fixed tolerance tells from a wrong one."""
        low = [t for t in flat(expected) if t.dtype in refereed_dtypes]
        if not low:
            return False
        lowp = low[0].dtype

        try:
            inp, args, kwargs = tmpl.build(REF)
            with torch.no_grad():
                exact = call(op, upcast((inp, args, kwargs), lowp), REF, factory)
            return closer(list(flat(actual)), list(flat(expected)), list(flat(exact)), lowp)
        except Exception:  # noqa: BLE001  (no float64 run: the mismatch stands)
            return False

    def dispatched(fn) -> set:
        """The aten operators (``name.overload``) that ``fn()`` dispatches, up
        to where it raises."""
        from torch.utils._python_dispatch import TorchDispatchMode

        seen = set()

        class Record(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                overload = func._overloadname
                seen.add(func._schema.name.removeprefix("aten::")
                         + ("" if overload == "default" else "." + overload))
                return func(*args, **(kwargs or {}))

        with contextlib.suppress(Exception), Record():
            fn()
        return seen

    def raised_in_flaggems(op, tmpl, factory) -> list:
        """The FlagGems operators a sample that raised on flagos dispatched:
        routing counts a FlagGems call when it returns, so one that raised is
        not among the ``used`` ones."""
        registered = set(torch_fl.flaggems.registered_ops())
        return sorted(registered & dispatched(lambda: call(op, tmpl.build(DEVICE), DEVICE, factory)))

    def run_sample(op, s, meta_only, tol):
        """(status, error, extra record fields) of one sample."""
        status, error, extra = run_sample_once(op, s, meta_only, tol)
        if attribute and status == "fail" and "tmpl" in extra:
            if not extra.get("used"):
                extra["used"] = raised_in_flaggems(op, extra["tmpl"], extra["factory"])
            if extra["used"]:
                extra.update(trace(op, s, extra["tmpl"], extra["expected"], extra["factory"],
                                   extra.get("meta", meta_only), tol, extra["used"]))
        for k in ("tmpl", "expected", "factory"):
            extra.pop(k, None)
        return status, error, extra

    def run_sample_once(op, s, meta_only, tol):
        if has_special((s.input, s.args, s.kwargs)):
            return "na", None, {}
        try:
            tmpl = Template(s, _CPU_ARGS.get(op.name, ()))
            f_built = tmpl.build(DEVICE)
        except _NotApplicable:
            return "na", None, {}
        except Exception as e:  # noqa: BLE001
            return "fail", "copying the sample to flagos: " + error_text(e), {}
        factory = not has_tensor((s.input, s.args, s.kwargs))
        try:
            with torch.no_grad():  # samples require grad for the backward runs
                expected = call(op, (s.input, s.args, s.kwargs), REF, factory)
            if on_cuda:
                torch.cuda.synchronize()  # an asynchronous error is the reference's
        except Exception:  # noqa: BLE001
            return "cpu-skip", None, {}
        if has_special(expected):
            return "na", None, {}
        extra = {}
        if attribute:
            routing.reset_stats()
        try:
            try:
                actual = call(op, f_built, DEVICE, factory)
            finally:
                if attribute:
                    extra["used"] = flaggems_used()
            if is_random(extra.get("used", ())):
                meta_only = extra["meta"] = extra["random"] = True
            compare_all(expected, s, actual, f_built, meta_only, tol)
        except _Mismatch as e:
            if attribute and not meta_only and refereed(op, s, tmpl, expected, actual, factory):
                extra["refereed"] = True
                return "pass", None, extra
            if on_cuda and not meta_only and reference_varies(op, s, tmpl, expected, factory, tol):
                extra.update(meta=True, nondet=True)
                try:
                    compare(expected, actual, "result", True, tol)
                except _Mismatch as e2:
                    return "fail", str(e2), extra
                return "pass", None, extra
            extra.update(tmpl=tmpl, expected=expected, factory=factory)
            return "fail", str(e), extra
        except Exception as e:  # noqa: BLE001
            extra.update(tmpl=tmpl, expected=expected, factory=factory)
            return "fail", error_text(e), extra
        return "pass", None, extra

    def reference_varies(op, s, tmpl, expected, factory, tol) -> bool:
        """Whether a second reference run, on a fresh copy of the sample with
        the same seed, disagrees with the first."""
        try:
            built = tmpl.build(REF)
            again = call(op, built, REF, factory)
            compare_all(expected, s, again, built, False, tol, dev=REF)
        except _Mismatch:
            return True
        except Exception:  # noqa: BLE001
            return False
        return False

    def context_error():
        """None, or the error of a CUDA context that can no longer be used."""
        if not on_cuda:
            return None
        try:
            torch.cuda.synchronize()  # a sticky error is raised by every call
        except Exception as e:  # noqa: BLE001
            return error_text(e)
        return None

    def raises_as(fn, ei) -> str | None:
        """None when ``fn()`` raises error input ``ei``'s error type with a
        message its pattern matches, else what happened instead."""
        try:
            fn()
            if on_cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            if isinstance(e, ei.error_type) and re.search(ei.error_regex, str(e)):
                return None
            return "raised " + error_text(e)
        return "raised nothing"

    def run_error_sample(op, ei, ref):
        """(status, error, extra) of error input ``ei`` (made on flagos);
        ``ref``: the same error input made on the reference device, or None."""
        s = ei.sample_input
        if has_special((s.input, s.args, s.kwargs)):
            return "na", None, {}
        if ref is not None:
            r = ref.sample_input
            if raises_as(lambda: call(op, (r.input, r.args, r.kwargs), REF, False), ref) is not None:
                return "cpu-skip", None, {}
        got = raises_as(lambda: call(op, (s.input, s.args, s.kwargs), DEVICE, False), ei)
        if got is None:
            return "pass", None, {}
        return "fail", (f"{got}, where {ei.error_type.__name__} matching "
                        f"/{ei.error_regex[:150]}/ was expected"), {}

    def error_inputs(op, name) -> tuple:
        """The error inputs of ``op`` made on flagos, and the same made on the
        reference device, paired by position (None where the counts differ).
        A generator that branches on the device type (narrow_copy's) may pair
        two different inputs: the reference's then only decides a cpu-skip."""
        torch.manual_seed(zlib.crc32(name.encode()) ^ seed)
        made = list(op.error_inputs(DEVICE))
        try:
            torch.manual_seed(zlib.crc32(name.encode()) ^ seed)
            refs = list(op.error_inputs(REF))
        except Exception:  # noqa: BLE001
            refs = []
        return made, refs if len(refs) == len(made) else [None] * len(made)

    def run_op(k, op, dtype, name, first, progress):
        """Runs the samples of op in ``dtype`` (results named ``name``) from index ``first``."""
        t0 = time.perf_counter()
        dname = str(dtype).removeprefix("torch.")
        errors = getattr(op, "kind", None) == "errors"
        flag = getattr(op, "has_nondeterministic_output", None)
        # Either says so: torch 2.11's OpInfos leave the flag False for empty_like and new_empty.
        meta_only = bool(flag) or name in _NONDETERMINISTIC_OUTPUT
        torch.manual_seed(zlib.crc32(name.encode()) ^ seed)
        gen_error, capped = None, False
        tol = tolerance(op, dtype)
        refs = []
        try:
            if errors:
                gen, refs = error_inputs(op, name)
            else:
                gen = op.sample_inputs(REF, dtype, requires_grad=wants_grad(op, dtype))
            if max_samples is None:
                samples = list(gen)
            else:
                samples = list(itertools.islice(gen, max_samples + 1))
                capped = len(samples) > max_samples
                samples = samples[:max_samples]
        except Exception as e:  # noqa: BLE001
            samples, gen_error = [], error_text(e)
            lost = context_error()
            if lost is not None:  # report the op; a new child goes on at the next
                _emit(kind="op", op=name, seconds=time.perf_counter() - t0,
                      capped=False, gen_error=gen_error)
                progress.set(0, k + 1, "")
                raise _ContextLost(lost) from None
        for i, s in enumerate(samples):
            if i < first:
                continue
            progress.set(i)
            if errors:
                status, error, extra = run_error_sample(op, s, refs[i])
            else:
                status, error, extra = run_sample(op, s, meta_only, tol)
            if attribute and wants_grad(op, dtype) and not meta_only and not extra.get("random"):
                grad = run_grad(op, s, dtype, tol)
                if grad is not None:
                    _emit(kind="grad", op=name, i=i, dtype=dname, **grad)
            lost = context_error()
            if lost is not None and status in ("pass", "na"):
                status, error, extra = "fail", "CUDA context lost after the sample: " + lost, {}
            extra.setdefault("meta", meta_only)
            _emit(kind="sample", op=name, i=i, status=status, error=error, dtype=dname, **extra)
            if lost is not None:
                progress.set(i + 1)
                raise _ContextLost(lost)
        progress.set(-2)
        _emit(kind="op", op=name, seconds=time.perf_counter() - t0,
              capped=capped, gen_error=gen_error)

    nd, nv = len(dtypes), len(variants)

    # FLAGOS_SWEEP_PART=i/n: only the ops whose op_db index is i modulo n (a
    # sweep split over several runs).
    part = os.environ.get("FLAGOS_SWEEP_PART")
    ipart, nparts = (int(x) for x in part.split("/")) if part else (0, 1)

    def run_ops(start_pair, start_sample, progress):
        for k, base in enumerate(op_db):
            if (k % nparts != ipart or (k + 1) * nv * nd <= start_pair
                    or (k // nparts) % stride != offset):
                continue
            if only is not None and base.full_name not in only and base.name not in only:
                continue
            for v, variant in enumerate(variants):
                op = _Variant.of(base, variant)
                for d, dname in enumerate(dtypes):
                    pair = (k * nv + v) * nd + d
                    if pair < start_pair or (variant == "errors" and d > 0):
                        continue
                    # Error inputs have no dtype: one run, named without it.
                    errors = variant == "errors"
                    name = (base.full_name + VARIANTS[variant] if errors
                            else _label(base.full_name + VARIANTS[variant], dname, dtypes))
                    progress.set(-1, pair, name)
                    if op is None:
                        _emit(kind="skip-op", op=name, why="no-variant")
                        continue
                    dtype = getattr(torch, dname)
                    if not errors and dtype not in base.supported_dtypes(REF):
                        _emit(kind="skip-op", op=name, why="no-dtype")
                        continue
                    if name.startswith(_NA_PREFIXES) or any(w in name for w in _NA_WORDS):
                        _emit(kind="skip-op", op=name, why="na")
                        continue
                    run_op(pair, op, dtype, name, start_sample if pair == start_pair else 0,
                           progress)

    return run_ops


def _run_child(run_ops, k: int, i: int, progress: _Progress) -> int:
    """Runs the ops in this (child) process; returns its exit status."""
    code = 0
    try:
        run_ops(k, i, progress)
    except _ContextLost:
        code = _RESTART
    except BaseException:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        code = 3
    sys.stdout.flush()
    return code


class _ForkedChild:
    """A child forked from this worker, which has imported op_db but never
    initialised the device (so the child may)."""

    def __init__(self, run_ops, k, i, progress):
        sys.stdout.flush()
        self.pid = os.fork()
        if self.pid == 0:
            os._exit(_run_child(run_ops, k, i, progress))

    def poll(self):
        done, status = os.waitpid(self.pid, os.WNOHANG)
        return os.waitstatus_to_exitcode(status) if done else None

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


class _SpawnedChild:
    """A child in a fresh interpreter; it writes its records to this worker's
    stdout (the pipe to the parent) and its progress to a shared file."""

    def __init__(self, argv, k, i, progress_path):
        sys.stdout.flush()
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child",
             "--start", f"{k}:{i}", "--progress", progress_path, *argv])

    def poll(self):
        return self.proc.poll()

    def kill(self):
        self.proc.kill()
        self.proc.wait()


def _worker_main(start: tuple[int, int], stride: int, offset: int,
                 only: set | None, max_samples: int | None, ref: str,
                 isolation: str, dtypes: tuple, provider: str, seed: int,
                 variants: tuple) -> None:
    """Runs this worker's ops in children, one after another, each going on
    where the last one stopped; a sample that crashes or hangs a child costs
    only that sample."""
    if isolation == "fork":
        run_ops = _load_runner(stride, offset, only, max_samples, ref, dtypes, provider, seed,
                               variants)
        progress, path = _Progress(), None

        def launch(k, i):
            return _ForkedChild(run_ops, k, i, progress)
    else:
        path = _Progress.new_file()
        progress = _Progress(path)
        argv = ["--stride", str(stride), "--offset", str(offset),
                "--max-samples", str(max_samples or 0), "--ref", ref,
                "--dtypes", ",".join(dtypes), "--provider", provider, "--seed", str(seed),
                "--variants", ",".join(variants)]
        if only is not None:
            argv += ["--ops", ",".join(sorted(only))]

        def launch(k, i):
            return _SpawnedChild(argv, k, i, path)

    try:
        _supervise(launch, progress, start, SAMPLE_TIMEOUT_FLAGGEMS_S
                   if provider == "flaggems" else SAMPLE_TIMEOUT_S)
    finally:
        if path is not None:
            os.unlink(path)


def _supervise(launch, progress: _Progress, start: tuple[int, int], timeout: float) -> None:
    k, i = start
    outside = 0
    while True:
        progress.set(-1, k, "")
        child = launch(k, i)
        last, since = progress.get(), time.monotonic()
        while True:
            code = child.poll()
            if code is not None:
                break
            cur = progress.get()
            if cur != last:
                last, since = cur, time.monotonic()
            elif time.monotonic() - since > timeout:
                child.kill()
                break
            time.sleep(0.005)
        if code == 0:
            break
        k, i = progress.get()
        if code == _RESTART:  # the sample that broke the CUDA context is reported
            i = max(i, 0)
            outside = 0
            continue
        if code is None:
            why = f"timeout: no result in {timeout:.0f}s"
        elif code < 0:
            why = f"crash: killed by {signal.Signals(-code).name}"
        else:
            why = f"crash: exited with status {code}"
        name = progress.name() or f"op #{k}"
        _emit(kind="crash")
        outside = outside + 1 if i < 0 else 0
        if outside >= 3:
            _emit(kind="abort", error=f"3 crashes in a row outside any sample, "
                  f"the last at op {name}: {why}")
            return
        if i < 0:  # outside any sample: starting, generating them, or after the last
            _emit(kind="op", op=name, seconds=0.0, capped=False, gen_error=why)
            k, i = k + 1, 0
        else:
            _emit(kind="sample", op=name, i=i, status="fail", error=why, meta=False)
            i += 1
    _emit(kind="end")


# --------------------------------------------------------------------------
# the parent: starts workers, survives their crashes, aggregates


def _worker_env(provider: str) -> dict:
    """The worker imports the torch_fl this process imports, with FlagGems off
    for the native provider."""
    env = dict(os.environ)
    if provider == "native":
        env["FLAGOS_DISABLE_FLAGGEMS_PY"] = "1"
    else:
        env.pop("FLAGOS_DISABLE_FLAGGEMS_PY", None)
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


def default_isolation(ref: str) -> str:
    """``fork`` for the CPU reference on the host driver, else ``spawn``: a
    child must not use CUDA that its parent initialised before forking."""
    if ref != "cpu":
        return "spawn"
    try:
        import torch_fl

        return "fork" if torch_fl.driver() == "host" else "spawn"
    except ImportError:
        return "fork"


def default_workers(ref: str) -> int:
    """CPU: one per core, up to 4. cuda: one per core, up to 8 (one GPU, one
    CUDA context each; the host side is most of the work)."""
    return max(1, min(8 if ref == "cuda" else 4, os.cpu_count() or 1))


class _Worker:
    def __init__(self, start, stride, offset, only, max_samples, ref, isolation, verbose,
                 dtypes, provider, seed, variants):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker",
               "--start", f"{start[0]}:{start[1]}",
               "--stride", str(stride), "--offset", str(offset),
               "--max-samples", str(max_samples or 0),
               "--ref", ref, "--isolation", isolation,
               "--dtypes", ",".join(dtypes), "--provider", provider, "--seed", str(seed),
               "--variants", ",".join(variants)]
        if only is not None:
            cmd += ["--ops", ",".join(sorted(only))]
        self.stride, self.offset = stride, offset
        self.only, self.max_samples, self.verbose = only, max_samples, verbose
        self.proc = subprocess.Popen(
            cmd, env=_worker_env(provider), stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if not verbose else None, text=True,
            bufsize=1)
        self.done = False


_DEFAULT = "default"


def run_sweep(only: set | None = None, max_samples: int | None | str = _DEFAULT,
              workers: int | None = None, verbose: bool = False, ref: str = "cpu",
              isolation: str | None = None, dtypes: tuple = ("float32",),
              provider: str = "native", seed: int = 0,
              variants: tuple = ("function",)) -> Result:
    """Runs the sweep against ``ref`` (``cpu`` or ``cuda``) in worker
    processes and returns the aggregated result. ``max_samples``: a per-op cap,
    None for none; by default :func:`default_max_samples`. ``dtypes``: names
    from DTYPES. ``provider``: one of PROVIDERS (``flaggems`` needs the cuda
    reference). ``seed``: 0 for the fixed per-op samples, else mixed into
    every op's seed (fresh inputs that the seed reproduces). ``variants``:
    names from VARIANTS (module docstring, "Variants")."""
    import queue
    import threading

    if ref not in REFS:
        raise ValueError(f"ref must be one of {', '.join(REFS)}, not {ref!r}")
    dtypes = _names("dtypes", dtypes, DTYPES)
    if provider not in PROVIDERS:
        raise ValueError(f"provider must be one of {', '.join(PROVIDERS)}, not {provider!r}")
    if provider == "flaggems" and ref != "cuda":
        raise ValueError("provider 'flaggems' compares FlagGems with native CUDA: use ref='cuda'")
    variants = _names("variants", variants, VARIANTS)
    if max_samples == _DEFAULT:
        max_samples = default_max_samples(ref)
    isolation = isolation or default_isolation(ref)
    if ref == "cuda" and isolation != "spawn":
        raise ValueError("the cuda reference needs spawn isolation: CUDA cannot be used "
                         "in a child forked after CUDA was initialised")
    res = Result(max_samples=max_samples, ref=ref, provider=provider)
    t0 = time.monotonic()
    n = workers or default_workers(ref)
    res.workers = n
    lines: queue.Queue = queue.Queue()

    def pump(w: _Worker) -> None:
        for line in w.proc.stdout:
            lines.put((w, line))
        lines.put((w, None))

    live = []
    for j in range(n):
        w = _Worker((0, 0), n, j, only, max_samples, ref, isolation, verbose, dtypes, provider,
                    seed, variants)
        threading.Thread(target=pump, args=(w,), daemon=True).start()
        live.append(w)
    # The workers' children time out samples; this is only a backstop.
    backstop = 2 * max(SAMPLE_TIMEOUT_S, SAMPLE_TIMEOUT_FLAGGEMS_S) + 60
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
                if verbose and kind in ("sample", "grad") and rec["status"] == "fail":
                    where = " backward" if kind == "grad" else ""
                    blame = ""
                    if "without_flaggems" in rec:
                        blame = " (fails with every op on cuda too)"
                    elif rec.get("culprits") is not None:
                        blame = (" (FlagGems: " + (", ".join(c[0] for c in rec["culprits"])
                                                   or "only " + "+".join(rec["used"])) + ")")
                    print(f"FAIL {rec['op']}{where} [{rec['i']}] {rec['error']}{blame}", flush=True)
                if verbose and kind == "op":
                    print(f"op {rec['op']}: {rec['seconds']:.2f}s", flush=True)
                res.add(rec)
    finally:
        for w in live:
            w.proc.kill()
    # Workers interleave: report failures in a stable order.
    res.failures.sort(key=lambda f: (f.op, f.index))
    res.nondeterministic.sort()
    res.seconds = time.monotonic() - t0
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", choices=REFS, default="cpu",
                   help="reference device (default: cpu)")
    p.add_argument("--ops", help="comma-separated op names or full names (default: all)")
    p.add_argument("--dtypes", default="float32",
                   help=f"comma-separated dtypes among {', '.join(DTYPES)} (default: float32)")
    p.add_argument("--provider", choices=PROVIDERS, default="native",
                   help="flagos runs with FlagGems off (native, the default) or on "
                        "(flaggems: failures traced to FlagGems kernels; needs --ref cuda)")
    p.add_argument("--seed", type=int, default=0,
                   help="0 (default): each op's fixed samples; else fresh samples that "
                        "this seed reproduces")
    p.add_argument("--variants", default=os.environ.get("FLAGOS_SWEEP_VARIANTS", "function"),
                   help=f"comma-separated forms among {', '.join(VARIANTS)} (default: "
                        "FLAGOS_SWEEP_VARIANTS, else function)")
    p.add_argument("--table", help="with --provider flaggems: write the per-operator "
                                   "pass table (markdown) here")
    p.add_argument("--max-samples", type=int, default=None,
                   help="cap samples per op, 0 for none (default: "
                        f"{MAX_SAMPLES_PER_OP or 'none'} with cpu, "
                        f"{MAX_SAMPLES_CUDA or 'none'} with cuda)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: cores, up to 4 with cpu, 8 with cuda)")
    p.add_argument("--isolation", choices=("fork", "spawn"), default=None,
                   help="how children are made (default: fork with cpu on the host "
                        "driver, else spawn)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--slowest", type=int, default=0, help="list the N slowest ops")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--progress", help=argparse.SUPPRESS)
    p.add_argument("--start", default="0:0", help=argparse.SUPPRESS)
    p.add_argument("--stride", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--offset", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    only = set(a.ops.split(",")) if a.ops else None
    dtypes = tuple(d.strip() for d in a.dtypes.split(",") if d.strip())
    variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
    if a.worker or a.child:
        k, i = (int(x) for x in a.start.split(":"))
        cap = a.max_samples or None
        if a.child:
            run_ops = _load_runner(a.stride, a.offset, only, cap, a.ref, dtypes, a.provider,
                                   a.seed, variants)
            return _run_child(run_ops, k, i, _Progress(a.progress))
        _worker_main((k, i), a.stride, a.offset, only, cap, a.ref,
                     a.isolation or default_isolation(a.ref), dtypes, a.provider, a.seed, variants)
        return 0
    if a.ref == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("--ref cuda: no CUDA device (torch.cuda.is_available() is False)")
            return 2
    cap = _DEFAULT if a.max_samples is None else (a.max_samples or None)
    try:
        res = run_sweep(only, cap, a.workers, a.verbose, a.ref, a.isolation, dtypes, a.provider,
                        a.seed, variants)
    except ValueError as e:
        p.error(str(e))
    print("\n".join(res.failure_lines()))
    for name, err in res.sample_gen_errors:
        print(f"sample-generation error: {name}: {err}")
    if res.nondeterministic:
        print(f"nondeterministic on {res.ref} (compared on shape, dtype and device):")
        print("\n".join(res.nondeterministic_lines()))
    for name, sec in sorted(res.op_seconds.items(), key=lambda kv: -kv[1])[:a.slowest]:
        print(f"slow: {name} {sec:.2f}s")
    print(res.summary())
    if a.provider == "flaggems":
        import torch_fl

        registered = torch_fl.flaggems.registered_ops()
        if a.table:
            with open(a.table, "w") as f:
                f.write(res.gems_table(registered, dtypes) + "\n")
        print("\n".join(res.gems_report(registered)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
