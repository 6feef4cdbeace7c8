"""The ``flaggems`` provider: FlagGems' Triton operators as flagos kernels.

On the cuda driver, when ``flag_gems`` is importable (from
``FLAGGEMS_SOURCE_DIR`` when set) and ``FLAGOS_DISABLE_FLAGGEMS_PY`` is not
``1``, every operator of FlagGems' op table (``flag_gems._FULL_CONFIG``) is
registered as a Python kernel of the flaggems backend, keyed by its aten name.
``flag_gems.enable()`` is not used: it registers on the CUDA key, and its
``unused=`` matches Python function names, not aten names.

The operators with a C++ description (csrc/flaggems, docs/flaggems_cpp.md)
are launched from C++ once their first call checked the plan against FlagGems'
wrapper (``cpp_ops()``, ``cpp_stats()``). With ``FLAGOS_DISABLE_FLAGGEMS_PY=1``
(the spec's C++ stub-only mode) no Python kernel is registered and only those
run FlagGems' kernels, compiled from its sources; everything else is native.

A flaggems kernel runs on zero-copy CUDA views of the flagos tensors, on the
current CUDA stream (which is the current flagos stream), so FlagGems sees
ordinary CUDA tensors. Never imported on a machine without a GPU: flag_gems
raises at import there.

Excluded (docs/flaggems.md keeps the reasons):
- CompositeImplicitAutograd operators: they decompose before any backend and
  keep their autograd formulas that way;
- ``FLAGOS_FLAGGEMS_UNUSED=op[,op...]`` (aten names, base or overload): the
  user's exclusions, the equivalent of ``enable(unused=...)``;
- the operators in ``EXCLUDED`` below;
- operators whose FlagGems function cannot take the operator's arguments
  (``mismatched_ops()`` says why).
"""

import inspect
import os
import warnings

import torch

from . import _C, _flaggems_cpp

_HOPPER_FLAT = ("on Hopper FlagGems treats the tensor as a flat contiguous buffer of numel() "
                "elements, so a strided view (a diagonal, a transpose) ")

# aten name -> why flagos does not take FlagGems' kernel for it.
EXCLUDED = {
    "_to_copy": "device-core: flagos converts through its own _to_copy and _copy_from",
    "copy_": "device-core: flagos copies through its own copy_ and _copy_from",
    "zeros": "factory: creates through flagos' empty, then fills (fill_ is routed)",
    "ones": "factory: creates through flagos' empty, then fills (fill_ is routed)",
    "full": "factory: creates through flagos' empty, then fills (fill_ is routed)",
    "zeros_like": "factory: creates through flagos' empty, then fills",
    "ones_like": "factory: creates through flagos' empty, then fills",
    "full_like": "factory: creates through flagos' empty, then fills",
    "arange": "factory: its Device argument is flagos, which FlagGems does not know",
    "arange.start": "factory: its Device argument is flagos, which FlagGems does not know",
    "arange.start_step": "factory: its Device argument is flagos, which FlagGems does not know",
    "linspace": "factory: its Device argument is flagos, which FlagGems does not know",
    "eye": "factory: its Device argument is flagos, which FlagGems does not know",
    "eye.m": "factory: its Device argument is flagos, which FlagGems does not know",
    "randn": "factory: its Device argument is flagos, which FlagGems does not know",
    "rand": "factory: its Device argument is flagos, which FlagGems does not know",
    "randperm": "factory: its Device argument is flagos, which FlagGems does not know",
    "_assert_async": "needs no kernel of its own",
    # Proved wrong by the OpInfo sweep against native CUDA (flag-gems 5.0.2,
    # H100; tests/python/test_flaggems.py, docs/flaggems.md has the table).
    "mul.Tensor": "wrong results: " + _HOPPER_FLAT + "is read as other elements; same-rank "
                  "operands are also taken to have one shape (no broadcasting)",
    "mm": "raises 'strides must be 16-byte aligned' on Hopper for ordinary shapes (a float32 "
          "matrix with a row length not a multiple of 4)",
    "mm.out": "as mm",
    "_upsample_nearest_exact1d": "wrong results (nearest-exact interpolation picks other sources)",
    "addcdiv": "raises on a broadcast input ('out tensor at index 0 shape is invalid')",
    "avg_pool2d": "wrong results with padding / ceil_mode (avg_pool1d samples)",
    "avg_pool2d_backward": "wrong gradients, as avg_pool2d",
    "native_batch_norm": "wrong save_mean / save_invstd (result[1], result[2])",
    "native_batch_norm_backward": "wrong gradients",
    "native_layer_norm": "returns mean and rstd as [N] where ATen's contract is [*batch, 1, ...]",
    # Found by Hugging Face models (GPT-2, BERT, OPT, Falcon, ...) against native CUDA.
    "native_layer_norm_backward": "wrong gradients for inputs of more than two dimensions: "
                                  "normalizes over everything after the first dimension, "
                                  "whatever normalized_shape says",
    "index.Tensor": "negative indices (x[..., [-1]]) are masked out: those elements are left "
                    "uninitialized instead of read from the end",
    "index_put": "negative indices are masked out: those writes are dropped",
    "index_put_": "as index_put",
    "_index_put_impl_": "as index_put",
    "linalg_vector_norm": "wrong results (1e12 off) on strided inputs (F.normalize samples)",
    "scatter_add_": "wrong results (cummax backward: 40% of the elements)",
    "div.Tensor_mode": "Triton compilation error in bfloat16 and float16 (rounding_mode='trunc')",
    "floor_divide": "Triton compilation error in bfloat16 and float16",
    "_flash_attention_forward": "raises 'head_size must be rounded to 32' where CUDA's kernel runs",
    "native_group_norm": "wrong results (half of the elements of small group_norm samples)",
    "native_group_norm_backward": "wrong gradients",
    "normal.Tensor_Tensor": "returns float32 for bfloat16 / float16 mean and std",
    "normal.Tensor_float": "returns float32 for a bfloat16 / float16 mean",
    "normal.float_Tensor": "returns float32 for a bfloat16 / float16 std",
    "pow.Tensor_Scalar": "less accurate than CUDA: 30 float32 ulps for pow(x, -1) (atanh's backward)",
    "topk": "raises 'Currently only support topk in last dimension' for other dimensions",
    "unfold_backward": "raises ZeroDivisionError (unfold_copy's backward)",
    "fill_.Scalar": "wrong results: " + _HOPPER_FLAT + "gets other elements written",
    "fill_.Tensor": "as fill_.Scalar",
    "fill.Scalar_out": "as fill_.Scalar",
    "fill.Tensor_out": "as fill_.Scalar",
    "sqrt": "wrong results: " + _HOPPER_FLAT + "is read as other elements (corrcoef)",
    "sqrt_": "as sqrt",
    "index_add_": "wrong results (stft's backward: every element)",
    "logaddexp": "NaN where CUDA gives -inf or a finite value (both inputs -inf)",
    "pow_.Scalar": "less accurate than CUDA in float16 (F.normalize's backward: 8 ulps)",
    "sum.dim_IntList": "less accurate than CUDA in float16: -126.69 for -127.5 (__rpow__'s "
                       "backward), 13 ulps where CUDA's float32 accumulation is exact to rounding",
    "_functional_sym_constrain_range_for_size": "a tracing helper, not a kernel",
    # Found by the sweep of the in-place and out= forms (2026-11-27).
    "scatter.reduce": "raises AssertionError 'reduce scatter bfloat tensors' for bfloat16, "
                      "where ATen's kernel takes every dtype",
    "scatter_.reduce": "as scatter.reduce",
    "div_.Tensor_mode": "as div.Tensor_mode: a Triton compilation error in bfloat16 and float16",
    "div.Scalar_mode": "FlagGems' div_mode kernel, as div.Tensor_mode",
    "div_.Scalar_mode": "FlagGems' div_mode kernel, as div.Tensor_mode",
    "floor_divide_": "as floor_divide: a Triton compilation error in bfloat16 and float16",
    "digamma_": "less accurate than CUDA in float32: 3.5e-6 relative, more than twice CUDA's "
                "error against float64",
    # Found by OpInfo's error inputs (2026-11-27): these accept arguments ATen
    # refuses, and compute something where CUDA raises.
    "masked_scatter": "accepts a mask that is not bool",
    "masked_scatter_": "as masked_scatter",
    "softshrink": "accepts a negative lambda",
    "softshrink.out": "as softshrink",
    "roll": "accepts a dim out of range, and no shifts",
    "scatter.src": "accepts a src of another dtype than self",
    "scatter_.src": "as scatter.src",
    "uniform_": "accepts from > to",
    "normal_": "accepts a negative std",
    "exponential_": "accepts a negative or NaN lambda, and gives -0.0 for an infinite one",
}

_registered = []
_unknown = []  # names in FlagGems' table that this torch has no operator for
_mismatched = {}  # name -> why FlagGems' function cannot take the operator's arguments
_cpp_ops = []  # operators the C++ launch path serves


def _unused_from_env() -> set:
    raw = os.environ.get("FLAGOS_FLAGGEMS_UNUSED", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    for n in names:
        base, _, overload = n.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        if packet is None or (overload and overload not in packet.overloads()):
            raise ValueError(
                f"FLAGOS_FLAGGEMS_UNUSED names '{n}', which is not an aten operator "
                "(write aten names: 'mm', 'add.Tensor')")
    return names


def _is_composite_implicit(name: str) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", "CompositeImplicitAutograd")
    except RuntimeError:  # no such operator in this torch: _register_python_kernel says so
        return False


def _signature_mismatch(name: str, fn) -> str:
    """Why `fn` cannot be called as the invoker calls kernels of aten operator
    `name` (every schema argument: positional ones by position, keyword-only
    ones by name), or "" when it can. FlagGems' table has functions written for
    a narrower signature than the operator's (`_grouped_mm` without bias and
    out_dtype): called, they raise TypeError in the middle of a model."""
    base, _, overload = name.partition(".")
    try:
        schema = getattr(getattr(torch.ops.aten, base), overload or "default")._schema
        sig = inspect.signature(fn)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return ""  # no such operator (reported by _register_python_kernel), or no signature
    args = schema.arguments
    try:
        sig.bind(*[None] * sum(not a.kwarg_only for a in args),
                 **{a.name: None for a in args if a.kwarg_only})
    except TypeError as e:
        return (f"its function {getattr(fn, '__name__', fn)}{sig} cannot take the operator's "
                f"arguments ({', '.join(a.name for a in args)}): {e}")
    return ""


def mismatched_ops() -> dict:
    """FlagGems operators not served because their function cannot take the
    operator's arguments: aten name -> why."""
    return dict(_mismatched)


def _stub_only() -> bool:
    return os.environ.get("FLAGOS_DISABLE_FLAGGEMS_PY", "0") == "1"


def register() -> list:
    """Registers FlagGems' operators with the flaggems backend; returns their aten names.

    A no-op (returning []) unless the driver is cuda and flag_gems imports.
    With FLAGOS_DISABLE_FLAGGEMS_PY=1 no Python kernel is registered: only the
    C++ launch path serves FlagGems' operators (``cpp_ops()``).
    Raises ValueError when FLAGGEMS_SOURCE_DIR names no flag_gems sources.
    """
    global _registered, _cpp_ops
    _flaggems_cpp.check_env()  # a wrong FLAGGEMS_SOURCE_DIR is an error on every driver
    if _C._driver_name() != "cuda":
        return []
    stub_only = _stub_only()
    unused = _unused_from_env()
    os.environ.setdefault("GEMS_VENDOR", "nvidia")  # FlagGems' auto-detection shells out
    try:
        flag_gems = _flaggems_cpp.import_flag_gems()
    except ImportError:
        if os.environ.get("FLAGGEMS_SOURCE_DIR"):
            raise
        return []
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001  (flag_gems raises at import on broken setups)
        warnings.warn(f"flag_gems is installed but failed to import ({e}); the flaggems backend is off")
        return []
    served = []
    for entry in flag_gems._FULL_CONFIG:
        if not entry or len(entry) < 2:
            continue
        name, fn = entry[0], entry[1]
        if len(entry) > 2 and callable(entry[2]) and not entry[2]():
            continue
        base = name.split(".")[0]
        if name in EXCLUDED or base in EXCLUDED or name in unused or base in unused:
            continue
        if _is_composite_implicit(name):
            continue
        mismatch = _signature_mismatch(name, fn)
        if mismatch:
            _mismatched[name] = mismatch
            continue
        served.append((name, fn))
    registered = []
    if not stub_only:
        for name, fn in served:
            if _C._register_python_kernel(name, fn):
                registered.append(name)
            else:
                _unknown.append(name)
    _registered = sorted(registered)
    _cpp_ops = _flaggems_cpp.install([name for name, _ in served], stub_only)
    return _registered


def registered_ops() -> list:
    """The aten operators registered as FlagGems Python kernels in this process."""
    return list(_registered)


def cpp_ops() -> list:
    """The aten operators whose FlagGems kernels are launched from C++ here."""
    return list(_cpp_ops)


def cpp_enabled() -> bool:
    """Whether the C++ launch path is on (FLAGOS_FLAGGEMS_CPP, set_cpp_enabled)."""
    return bool(_cpp_ops) and _C._flaggems_cpp_enabled()


def set_cpp_enabled(on: bool) -> None:
    """Turns the C++ launch path on or off for this process; off, every
    flaggems call runs FlagGems' Python wrapper (not in stub-only mode, which
    has no wrapper: those calls then run natively)."""
    _C._flaggems_set_cpp_enabled(bool(on))


def cpp_stats() -> dict:
    """Counters of the C++ launch path: launches, captures (first calls of a
    kernel key, run through FlagGems' wrapper and checked), admitted / pinned
    keys, disk-cache hits, stub-only compilations; per operator
    ``ops[name] = (launched, captured, declined)``; ``pinned``: the keys that
    stay on Python and why; ``disk_dir``: the kernel cache."""
    stats = dict(_C._flaggems_stats())
    stats["disk_dir"] = _C._flaggems_disk_dir() if _cpp_ops else ""
    return stats
