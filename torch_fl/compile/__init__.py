"""torch.compile on the flagos device (docs/compile.md).

Nothing here imports Dynamo or Inductor at ``import torch_fl``: both are heavy
and most programs never compile. :func:`install` (run by ``import torch_fl``)
only arranges for the registrations to happen when PyTorch first needs them:

- Dynamo's device interface, right after ``torch._dynamo.device_interface``
  is imported (Dynamo has no lazy hook for a PrivateUse1 device);
- the ``flagos`` backend name (``torch.compile(backend="flagos")``, backend.py),
  right after Dynamo's backend registry is imported;
- Dynamo's rules for torch.flagos calls in compiled code (dynamo_rules.py),
  right after ``torch._dynamo`` is imported;
- on the cuda driver, the GPU-type entry Inductor's ``is_gpu`` reads, right
  after ``torch._inductor.utils`` is imported;
- the memory format FakeTensors predict for a flagos convolution, the native
  device's (conv_layout.py), right after ``torch._subclasses.fake_impls`` is
  imported;
- libtorch_fl_aoti.so (the C shims of Inductor's C++ wrapper and the
  AOTInductor runner, cpp_wrapper.py), right after ``torch._inductor`` is
  imported, so that ``torch._inductor.aoti_load_package`` finds the flagos
  runner in a process that never compiles;
- Inductor's backend (scheduling, wrapper, device op overrides), when Inductor
  first asks the device module for it (``init_backend_registration`` reads
  ``torch.flagos.Scheduling`` and friends; see torch_fl/flagos/__init__.py).

Plain ``torch.compile(fn)`` then works with no user action.
"""

import importlib
import threading

from .. import _import_hooks

_lock = threading.RLock()
_backend = None  # the registered Inductor backend (a module), once registered


def _register_dynamo_interface() -> None:
    module = importlib.import_module(f"{__name__}.device_interface")
    # A program that imports device_interface itself runs this hook from the
    # module's first line (it imports Dynamo): the module, still executing,
    # registers itself at its end instead.
    if hasattr(module, "register"):
        module.register()


def _register_dynamo_backend() -> None:
    from . import backend

    backend.register()


def _add_dynamo_rules() -> None:
    from . import dynamo_rules

    dynamo_rules.install()


def _register_gpu_type() -> None:
    from . import _compat

    _compat.add_gpu_type("flagos")


def _match_conv_layouts() -> None:
    from . import conv_layout

    conv_layout.install_now()


def _load_aoti_library() -> None:
    from . import cpp_wrapper

    cpp_wrapper.load_library()


def install() -> None:
    """Arranges the lazy registrations; cheap and idempotent."""
    from .. import _C

    after_import = {
        "torch._dynamo.device_interface": _register_dynamo_interface,
        "torch._dynamo.backends.registry": _register_dynamo_backend,
        # Not a submodule: trace_rules and variables.torch import each other, so
        # either may still be executing when the other's hook runs.
        "torch._dynamo": _add_dynamo_rules,
        "torch._subclasses.fake_impls": _match_conv_layouts,
    }
    if _C._driver_name() == "cuda":
        after_import["torch._inductor.utils"] = _register_gpu_type
    for name, callback in after_import.items():
        _import_hooks.after_import(name, callback, "torch.compile on flagos tensors will fail")
    # AOTInductor's package loader finds the flagos runner by name.
    _import_hooks.after_import("torch._inductor", _load_aoti_library,
                               "AOTInductor packages compiled for flagos will not load")


def inductor_backend():
    """Registers flagos with Inductor once (for the active driver) and returns its backend module.

    The module has ``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``
    and ``WrapperFxCodegen`` (None where unsupported), the names Inductor reads
    from the device module.
    """
    global _backend
    with _lock:
        if _backend is None:
            # Dynamo is imported by now (Inductor imports it), so the interface
            # hook has run; import it anyway for callers that reach here first.
            import torch._dynamo.device_interface  # noqa: F401

            from .. import _C

            if _C._driver_name() == "cuda":
                import torch._inductor.utils  # noqa: F401  (the GPU-type hook)

                from . import cuda as backend
            else:
                from . import host as backend
            backend.register()
            _backend = backend
        return _backend


__all__ = ["install", "inductor_backend"]
