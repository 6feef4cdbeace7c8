"""The ``flaggems`` provider: FlagGems' Triton operators as flagos kernels.

On the cuda driver, when ``flag_gems`` is importable and
``FLAGOS_DISABLE_FLAGGEMS_PY`` is not ``1``, every operator of FlagGems' op
table (``flag_gems._FULL_CONFIG``) is registered as a Python kernel of the
flaggems backend, keyed by its aten name. ``flag_gems.enable()`` is not used:
it registers on the CUDA key, and its ``unused=`` matches Python function
names, not aten names.

A flaggems kernel runs on zero-copy CUDA views of the flagos tensors, on the
current CUDA stream (which is the current flagos stream), so FlagGems sees
ordinary CUDA tensors. Never imported on a machine without a GPU: flag_gems
raises at import there.

Excluded (docs/flaggems.md keeps the reasons):
- CompositeImplicitAutograd operators: they decompose before any backend and
  keep their autograd formulas that way;
- ``FLAGOS_FLAGGEMS_UNUSED=op[,op...]`` (aten names, base or overload): the
  user's exclusions, the equivalent of ``enable(unused=...)``;
- the operators in ``EXCLUDED`` below.
"""

import os
import warnings

import torch

from . import _C

# aten name -> why flagos does not take FlagGems' kernel for it.
EXCLUDED = {
    "_to_copy": "device-core: flagos copies through its own _copy_from",
    "copy_": "device-core: flagos copies through its own _copy_from",
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
    "_functional_sym_constrain_range_for_size": "a tracing helper, not a kernel",
}

_registered = []
_unknown = []  # names in FlagGems' table that this torch has no operator for


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


def register() -> list:
    """Registers FlagGems' operators with the flaggems backend; returns their aten names.

    A no-op (returning []) unless the driver is cuda, FLAGOS_DISABLE_FLAGGEMS_PY
    is not 1 and flag_gems imports.
    """
    global _registered
    if _C._driver_name() != "cuda" or os.environ.get("FLAGOS_DISABLE_FLAGGEMS_PY", "0") == "1":
        return []
    unused = _unused_from_env()
    os.environ.setdefault("GEMS_VENDOR", "nvidia")  # FlagGems' auto-detection shells out
    try:
        import flag_gems
    except ImportError:
        return []
    except Exception as e:  # noqa: BLE001  (flag_gems raises at import on broken setups)
        warnings.warn(f"flag_gems is installed but failed to import ({e}); the flaggems backend is off")
        return []
    registered = []
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
        if _C._register_python_kernel(name, fn):
            registered.append(name)
        else:
            _unknown.append(name)
    _registered = sorted(registered)
    return _registered


def registered_ops() -> list:
    """The aten operators the flaggems backend serves in this process."""
    return list(_registered)
