"""The Python side of the C++ launch path of FlagGems' kernels (docs/flaggems_cpp.md).

libtorch_fl plans and launches FlagGems' Triton kernels itself; it asks this
module, on slow paths only, for what only Python knows:

- ``export_fn``: a FlagGems JIT function's parameters (Triton's KernelParam
  flags) and source hash, once per function (per rank for the kernels FlagGems
  generates for a pointwise function);
- ``pointwise_info``: a PointwiseDynamicFunction's layout (which arguments are
  tensors, dtype promotion, tile budget);
- ``capture_begin`` / ``capture_end``: the Triton launches FlagGems' own Python
  wrapper made during one call, through Triton's launch hook, with Triton's
  specialization of every argument and the compiled cubin, so that C++ can
  check its plan against them;
- ``compile``: ``triton.compile`` of a planned specialization, for the C++
  stub-only mode (``FLAGOS_DISABLE_FLAGGEMS_PY=1``), where no wrapper runs.

It also finds FlagGems: ``FLAGGEMS_SOURCE_DIR`` (the spec's knob) names the
``flag_gems`` package directory to take the kernels from; unset, the installed
``flag_gems``.
"""

import importlib
import os
import sys
import threading

_fns = []      # export id -> JITFunction
_ids = {}      # id(JITFunction) -> export id
# Captures in progress, by thread: FlagGems' wrappers release the GIL inside
# torch calls, so another thread may capture at the same time.
_captures = {}


# ---- finding FlagGems --------------------------------------------------------------

def _how_to_find() -> str:
    return ("set it to FlagGems' package directory, which "
            "`python -c \"import os, flag_gems; print(os.path.dirname(flag_gems.__file__))\"` "
            "prints, or to a FlagGems checkout (holding flag_gems/ or src/flag_gems/)")


def source_dir():
    """The flag_gems package directory FLAGGEMS_SOURCE_DIR names, or None when unset.

    Raises ValueError naming the variable when it names no flag_gems sources.
    """
    raw = os.environ.get("FLAGGEMS_SOURCE_DIR")
    if raw is None:
        return None
    if not raw.strip():
        raise ValueError("FLAGGEMS_SOURCE_DIR is set but empty: " + _how_to_find())
    path = os.path.abspath(os.path.expanduser(raw))
    if not os.path.isdir(path):
        raise ValueError(f"FLAGGEMS_SOURCE_DIR={raw!r} is not a directory: " + _how_to_find())
    for candidate in (path, os.path.join(path, "flag_gems"), os.path.join(path, "src", "flag_gems")):
        if (os.path.basename(candidate) == "flag_gems"
                and os.path.isfile(os.path.join(candidate, "__init__.py"))
                and os.path.isdir(os.path.join(candidate, "ops"))):
            return candidate
    raise ValueError(f"FLAGGEMS_SOURCE_DIR={raw!r} holds no flag_gems sources (expected a "
                     "'flag_gems' directory with __init__.py and ops/): " + _how_to_find())


def import_flag_gems():
    """Imports flag_gems, from FLAGGEMS_SOURCE_DIR when it is set (see source_dir)."""
    pkg = source_dir()
    if pkg is not None:
        loaded = sys.modules.get("flag_gems")
        if loaded is None:
            parent = os.path.dirname(pkg)
            if parent not in sys.path:
                sys.path.insert(0, parent)
    import flag_gems  # noqa: PLC0415

    if pkg is not None:
        where = os.path.realpath(os.path.dirname(flag_gems.__file__))
        if where != os.path.realpath(pkg):
            raise ValueError(f"FLAGGEMS_SOURCE_DIR names {pkg}, but flag_gems was imported from "
                             f"{where} (imported before torch_fl, or shadowed on sys.path): "
                             "import torch_fl first, or point FLAGGEMS_SOURCE_DIR there")
    return flag_gems


def check_env() -> None:
    """Validates this module's variables on every driver (C++ reads them again on the GPU)."""
    for name, valid in (("FLAGOS_FLAGGEMS_CPP", ("0", "1")), ("FLAGOS_FLAGGEMS_VERIFY", ("first", "strict"))):
        value = os.environ.get(name)
        if value is not None and value not in valid:
            raise ValueError(f"{name}={value!r} is not valid: use " + " or ".join(valid))
    source_dir()


# ---- exports ---------------------------------------------------------------------------

def _jit_function(obj):
    import triton

    seen = 0
    while not isinstance(obj, triton.runtime.JITFunction):
        nxt = getattr(obj, "jit_function", None) or getattr(obj, "fn", None)
        if nxt is None or seen > 8:
            raise TypeError(f"{obj!r} is not a Triton JIT function (nor wraps one)")
        obj, seen = nxt, seen + 1
    return obj


def _record_launch(fn_id):
    def launch_metadata(grid, metadata, args):
        cap = _captures.get(threading.get_ident())
        if cap is not None:
            cap["launches"].append((fn_id, tuple(grid), metadata, dict(args)))
        return {}
    return launch_metadata


def _register(jit) -> int:
    key = id(jit)
    if key in _ids:
        return _ids[key]
    fn_id = len(_fns)
    _fns.append(jit)
    _ids[key] = fn_id
    if jit.launch_metadata is not None:
        raise TypeError(f"{jit.__name__} already has a launch_metadata function")
    # Evaluated only when a launch-enter hook asks for it (capture_end's hook).
    jit.launch_metadata = _record_launch(fn_id)
    return fn_id


def _params(jit):
    out = []
    for kp in jit.params:
        ann = kp.annotation_type if isinstance(kp.annotation_type, str) else ""
        out.append((kp.name, bool(kp.is_constexpr), "" if kp.is_constexpr else ann,
                    bool(kp.do_not_specialize), bool(kp.do_not_specialize_on_alignment),
                    bool(kp.is_const)))
    return out


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def export_fn(ref: str) -> dict:
    """`module:qualname`, or `module:pointwise_fn@rank` for a generated pointwise kernel."""
    try:
        name, _, rank = ref.partition("@")
        obj = _resolve(name)
        if rank:
            rank = int(rank)
            overload = obj.instantiate(rank)
            kernel = f"{obj._scalar_fn.__name__}_kernel_rank_{rank}"
            obj = overload.__globals__[kernel]
        jit = _jit_function(obj)
        fn_id = _register(jit)
        return {"id": fn_id, "cache_key": jit.cache_key, "params": _params(jit)}
    except Exception as e:  # noqa: BLE001  (reported by C++, which keeps the op on Python)
        return {"error": f"{type(e).__name__}: {e}"}


def pointwise_info(ref: str) -> dict:
    try:
        import torch

        import flag_gems

        pdf = _resolve(ref)
        if getattr(flag_gems, "vendor_name", "nvidia") != "nvidia":
            return {"error": f"vendor {flag_gems.vendor_name}: the planner models NVIDIA's "
                             "code generation settings"}
        fx, config = pdf.fx, pdf.config
        n = fx.num_inputs()
        # gen_task_partition: the tile budget is halved when no tensor input
        # declares a non-complex dtype (undeclared ones included).
        all_complex = all(fx.input_type(i) is None or fx.input_type(i) in (torch.complex64, torch.complex128)
                          for i in range(n) if fx.is_tensor(i))
        max_tile = config.max_tile_size // 2 if all_complex else config.max_tile_size
        promotions = []
        for pm in fx._promotion_methods:
            *args, method = pm
            promotions.append(([int(a) for a in args], getattr(method, "name", str(method))))
        return {"is_tensor": [bool(fx.is_tensor(i)) for i in range(n)], "promotions": promotions,
                "max_tile": int(max_tile), "max_grid0": int(config.max_grid_size[0]),
                "block_pointer": bool(config.prefer_block_pointer),
                "tile_1d": bool(config.prefer_1d_tile)}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


# ---- capture -------------------------------------------------------------------------

def _enter_hook(lazy):
    cap = _captures.get(threading.get_ident())
    if cap is None:
        return
    cap["total"] += 1
    lazy.get()  # runs the exported functions' launch_metadata (_record_launch)


def capture_begin() -> None:
    import triton

    _captures[threading.get_ident()] = {"launches": [], "total": 0}
    triton.knobs.runtime.launch_enter_hook.add(_enter_hook)


def _arg(value, spec):
    kind, attr = spec[0], spec[1] if len(spec) > 1 else None
    if not isinstance(attr, str):
        attr = None  # ("i32", 1): an annotated int equal to 1 has no attribute
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        elem = kind.lstrip("*").removeprefix("k") if kind.startswith("*") else "?"
        return ("ptr", int(value.data_ptr()), elem, kind, attr)
    if isinstance(value, bool):
        return ("bool", value, None, kind, attr)
    if isinstance(value, int):
        return ("int", value, None, kind, attr)
    if isinstance(value, float):
        return ("float", value, None, kind, attr)
    if value is None:
        return ("none", None, None, kind, attr)
    return ("other", repr(value), None, kind, attr)


def _compiled(jit, md):
    import triton

    device = triton.runtime.driver.active.get_current_device()
    for kernel in jit.device_caches[device][0].values():
        if hasattr(kernel, "result") and not hasattr(kernel, "hash"):
            continue  # a compilation still in flight (async mode)
        if getattr(kernel, "hash", None) == md.hash:
            return kernel.asm["cubin"]
    # Not in the JIT function's memory cache: Triton's on-disk cache has it.
    from triton.runtime.cache import get_cache_manager

    group = get_cache_manager(md.hash).get_group(f"{md.name[:150]}.json") or {}
    for name, path in group.items():
        if name.endswith(".cubin"):
            with open(path, "rb") as f:
                return f.read()
    return b""


def _binary(md, cubin) -> dict:
    return {"name": md.name, "hash": md.hash, "cubin": bytes(cubin), "shared": int(md.shared),
            "num_warps": int(md.num_warps), "num_stages": int(md.num_stages),
            "num_ctas": int(md.num_ctas),
            "global_scratch": int(getattr(md, "global_scratch_size", 0) or 0),
            "profile_scratch": int(getattr(md, "profile_scratch_size", 0) or 0),
            "cooperative": bool(getattr(md, "launch_cooperative_grid", False)),
            "pdl": bool(getattr(md, "launch_pdl", False)),
            "tensor_descriptors": bool(getattr(md, "tensordesc_meta", None))}


def capture_end() -> dict:
    import triton

    cap = _captures.pop(threading.get_ident(), None)
    if not _captures:
        triton.knobs.runtime.launch_enter_hook.remove(_enter_hook)
    if cap is None:
        return {"total": 0, "error": "no capture in progress", "launches": []}
    launches = []
    try:
        device = triton.runtime.driver.active.get_current_device()
        for fn_id, grid, md, args in cap["launches"]:
            jit = _fns[fn_id]
            binder = jit.device_caches[device][4]
            _, specialization, _ = binder(**{k: v for k, v in args.items()})
            grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
            launches.append({
                "fn_id": fn_id, "grid": grid[:3], "binary": _binary(md, _compiled(jit, md)),
                "args": [_arg(args[name], spec) for name, spec in zip(jit.arg_names, specialization)],
            })
    except Exception as e:  # noqa: BLE001  (the C++ side keeps the key on Python)
        return {"total": cap["total"], "error": f"{type(e).__name__}: {e}", "launches": []}
    return {"total": cap["total"], "error": "", "launches": launches}


# ---- stub-only compilation -------------------------------------------------------------

def compile(fn_id: int, specs: list, num_warps: int, num_stages: int) -> dict:  # noqa: A001
    """triton.compile of FlagGems' function `fn_id` for a planned specialization.

    `specs`: per parameter, ("constexpr", value) or (type, attr) with attr "D",
    "" or None, as Triton's binder gives them; the kernel is the one FlagGems'
    JIT would compile for the same call (same hash).
    """
    import triton
    from triton import knobs
    from triton.compiler import ASTSource, make_backend

    jit = _fns[fn_id]
    signature, constexprs, attrs = {}, {}, {}
    for i, (name, spec) in enumerate(zip(jit.arg_names, specs)):
        kind, extra = spec
        signature[name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = extra
        elif extra is not None:
            attrs[(i,)] = [["tt.divisibility", 16]] if extra == "D" else []
    target = triton.runtime.driver.active.get_current_target()
    backend = make_backend(target)
    options = backend.parse_options({
        "num_warps": num_warps, "num_stages": num_stages,
        "debug": bool(jit.debug) or knobs.runtime.debug,
        "instrumentation_mode": knobs.compilation.instrumentation_mode,
    })
    kernel = triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target,
                            options=options.__dict__)
    out = _binary(kernel.metadata, kernel.asm["cubin"])
    out["entry_sizes"] = _entry_sizes(kernel.asm.get("ptx", ""), kernel.metadata.name)
    return out


_PTX_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}


def _entry_sizes(ptx: str, name: str) -> list:
    """Byte sizes of the PTX entry's parameters (what cuFuncGetParamInfo reports)."""
    import re

    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if not m:
        return []
    sizes = []
    for p in m.group(1).split(","):
        t = re.search(r"\.param\s+\.[a-z]+(\d+)", p)
        if t:
            sizes.append(_PTX_SIZES[t.group(1)])
    return sizes


# ---- installation --------------------------------------------------------------------

def install(served: list, stub_only: bool) -> list:
    """Hands the C++ launcher the aten ops it may serve (`served`: the ones
    FlagGems serves here, after torch_fl's exclusions); returns those it describes."""
    import triton

    from . import _C

    ops = set(_C._flaggems_all_described_ops()) & set(served)
    if os.environ.get("USE_FLAGTUNE") == "1":  # FlagGems' tuner keys and configs differ then
        ops -= {"bmm", "addmm"}
    _C._flaggems_set_python_side(sys.modules[__name__])
    _C._flaggems_install(sorted(ops), triton.__version__, stub_only)
    return sorted(_C._flaggems_described_ops())
