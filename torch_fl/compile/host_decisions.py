"""Inductor's choices by device name, answered as the CPU's on the host driver.

Inductor takes some decisions while lowering and scheduling, before any kernel
is generated, by comparing the device type's name with ``"cpu"``. Host-driver
flagos memory is host memory and its kernels are Inductor's C++ ones, so the
CPU's answer is the right one. Where the other answer gives a wrong or
nondeterministic result, or code the C++ backend cannot generate, that one
question is answered as for the CPU, for flagos only:

- ``argmax``/``argmin`` over several dimensions of a transposed or permuted
  input: the CPU's C++ kernels compute the logical index; without it the
  result is the index in memory order (a wrong answer);
- ``scatter_add``/``scatter_reduce(sum)``: the CPU falls back to ATen's kernel
  when kernels run on several threads, where the generated code's atomic adds
  give a different float sum on each run;
- combo kernels (``config.combo_kernels``): never formed from CPU nodes, whose
  C++ scheduling cannot generate them;
- ``var_mean`` (``var``, ``std``, LayerNorm and BatchNorm's statistics): the CPU
  takes the two-pass variance up to 1024 elements, others Welford's from 8.
  In float32 over data far from zero Welford's loses digits (``std`` of 64
  values around 1e4: 2e-4 relative error, the CPU's 6e-7), and every such
  reduction differed from compiled CPU in the last bits;
- whether a value used twice is stored or recomputed (``exp``, ``log``,
  ``tanh``... are stored on the CPU): the last bits of a masked softmax, and
  the kernels' speed;
- a convolution's bias: other devices peel it off the convolution and add it
  in a generated kernel (cuDNN is slower with it), the CPU's ATen kernel adds
  it itself. The extra rounding put a bf16 convolution an ulp off compiled
  and eager CPU on many elements (float32: a few 1e-7). Convolution is
  lowered for flagos with every device question answered as the CPU's (the
  rest of its choices are Triton templates', which no CPU layout takes);
- division by a constant (``x / 3``, ``hardswish``, ``sum / n``, the bias
  correction of a capturable Adam): other devices multiply by the reciprocal,
  the CPU divides (pytorch#157959), so every such quotient differed from eager
  and compiled CPU in the last bit. While ``div_prim`` lowers a division of a
  flagos value, ``get_constant_value`` (which it asks of the divisor) answers
  "no known constant".

Other such choices are left as they are (docs/compile.md): the CPU-only
small-matmul rewrites, and the CPU's higher thresholds for realizing a value
with a large expression or many reads (``has_large_inner_fn``,
``has_exceeded_max_reads``). They move results by an ulp or so.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from torch._inductor import config, ir, lowering, scheduler

from .._wrap import wrap_once

_ARG_REDUCTIONS = frozenset({
    "argmax", "argmin", "argmax_value", "argmin_value", "argmax_with_value", "argmin_with_value",
})

# Set while a lowering decision is asked on behalf of a flagos node.
_as_cpu = threading.local()


def _get_device_type(original):
    def get_device_type(x):
        device_type = original(x)
        if device_type == "flagos" and getattr(_as_cpu, "on", False):
            return "cpu"
        return device_type

    return get_device_type


@contextlib.contextmanager
def _device_type_answered_as_cpu():
    previous = getattr(_as_cpu, "on", False)
    _as_cpu.on = True
    try:
        yield
    finally:
        _as_cpu.on = previous


def _make_reduction_inner(original):
    def _make_reduction_inner(x, **kwargs):
        if kwargs.get("reduction_type") not in _ARG_REDUCTIONS or not _on_flagos(x):
            return original(x, **kwargs)
        # The C++ backend computes the logical index, whatever cpu_backend
        # says (the host driver always generates C++).
        with _device_type_answered_as_cpu(), config.patch(cpu_backend="cpp"):
            return original(x, **kwargs)

    return _make_reduction_inner


def _as_cpu_for_flagos(original):
    """`original`, asked every device question as the CPU's when its first
    argument is an IR node on flagos (StorageBox.should_realize_on_reuse's
    self, the convolution lowering's input)."""
    def as_cpu_for_flagos(node, *args, **kwargs):
        if not (isinstance(node, ir.IRNode) and _on_flagos(node)):
            return original(node, *args, **kwargs)
        with _device_type_answered_as_cpu():
            return original(node, *args, **kwargs)

    return as_cpu_for_flagos


def _use_scatter_fallback(original):
    def use_scatter_fallback(op_overload, reduction_type, self_dtype, src_dtype, src_device_type,
                             src_is_tensor):
        if src_device_type == "flagos":
            src_device_type = "cpu"
        return original(op_overload, reduction_type, self_dtype, src_dtype, src_device_type,
                        src_is_tensor)

    return use_scatter_fallback


def _use_two_step_variance(original):
    def use_two_step_variance(x, *args, **kwargs):
        cpu_threshold = getattr(config.cpp, "use_two_step_variance_threshold", None)
        if cpu_threshold is None or not _on_flagos(x):
            return original(x, *args, **kwargs)
        # A device not named cpu or cuda gets the general threshold: the
        # CPU's own gives the CPU's choice.
        with config.patch(unroll_reductions_threshold=cpu_threshold):
            return original(x, *args, **kwargs)

    return use_two_step_variance


# Set while div_prim lowers a division of a flagos value.
_dividing_on_flagos = threading.local()


def _div_prim(original):
    def div_prim(*args, **kwargs):
        if not any(isinstance(a, ir.IRNode) and _on_flagos(a) for a in args):
            return original(*args, **kwargs)
        previous = getattr(_dividing_on_flagos, "on", False)
        _dividing_on_flagos.on = True
        try:
            return original(*args, **kwargs)
        finally:
            _dividing_on_flagos.on = previous

    return div_prim


def _get_constant_value(original):
    def get_constant_value(x):
        # div_prim asks it of the divisor (a constant becomes a multiplication
        # by its reciprocal on any device but the CPU); the CPU divides.
        if getattr(_dividing_on_flagos, "on", False):
            return None
        return original(x)

    return get_constant_value


def _repoint_lowerings(original, replacement) -> None:
    """Every lowering-table entry holding `original` (one per overload) now holds `replacement`."""
    for key, fn in list(lowering.lowerings.items()):
        if fn is original:
            lowering.lowerings[key] = replacement


def _install_div_prim() -> None:
    """div_prim is called by name (div, avg_pool) and through the lowering table (prims.div)."""
    original = getattr(lowering, "div_prim", None)
    if original is None or not hasattr(lowering, "get_constant_value"):
        return
    wrap_once(lowering, "div_prim", _div_prim)
    wrap_once(lowering, "get_constant_value", _get_constant_value)
    _repoint_lowerings(original, lowering.div_prim)


def _install_convolution() -> None:
    """The convolution lowering, reached through the table only, asked as the CPU for flagos."""
    original = lowering.lowerings.get(torch.ops.aten.convolution.default)
    if original is None or getattr(original, "_flagos_as_cpu", False):
        return  # not lowered by this torch, or installed already
    wrapped = _as_cpu_for_flagos(original)
    wrapped._flagos_as_cpu = True
    _repoint_lowerings(original, wrapped)


def _group_without_flagos(grouping):
    def group_algorithm(scheduler):
        return [[n for n in group if not _on_flagos(n)] for group in grouping(scheduler)]

    return group_algorithm


def _on_flagos(node) -> bool:
    device = node.get_device()
    return device is not None and device.type == "flagos"


def install() -> None:
    """Installs the answers (at the host driver's first compile; idempotent).

    Each only where this torch has the function (found by feature, not by
    version); the others need the scoped answer of get_device_type.
    """
    if not hasattr(ir, "get_device_type"):
        return
    combo = getattr(scheduler, "ForeachKernelSchedulerNode", None)
    for owner, name, wrapper in (
        (ir, "get_device_type", _get_device_type),
        (lowering, "_make_reduction_inner", _make_reduction_inner),
        (lowering, "use_scatter_fallback", _use_scatter_fallback),
        (lowering, "use_two_step_variance", _use_two_step_variance),
        (ir.StorageBox, "should_realize_on_reuse", _as_cpu_for_flagos),
        (combo, "group_algorithm_for_combo_kernels", _group_without_flagos),
    ):
        if owner is not None and hasattr(owner, name):
            wrap_once(owner, name, wrapper)
    _install_div_prim()
    _install_convolution()
