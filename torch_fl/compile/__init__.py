"""torch.compile on the flagos device (docs/compile.md).

Nothing here imports Dynamo or Inductor at ``import torch_fl``: both are heavy
and most programs never compile. :func:`install` (run by ``import torch_fl``)
only arranges for the registrations to happen when PyTorch first needs them:

- Dynamo's device interface, right after ``torch._dynamo.device_interface``
  is imported (Dynamo has no lazy hook for a PrivateUse1 device);
- the ``flagos`` backend name (``torch.compile(backend="flagos")``, backend.py),
  right after Dynamo's backend registry is imported;
- on the cuda driver, the GPU-type entry Inductor's ``is_gpu`` reads, right
  after ``torch._inductor.utils`` is imported;
- Inductor's backend (scheduling, wrapper, device op overrides), when Inductor
  first asks the device module for it (``init_backend_registration`` reads
  ``torch.flagos.Scheduling`` and friends; see torch_fl/flagos/__init__.py).

Plain ``torch.compile(fn)`` then works with no user action.
"""

import importlib.abc
import sys
import threading
import warnings

_lock = threading.RLock()
_backend = None  # the registered Inductor backend (a module), once registered


def _register_dynamo_interface() -> None:
    from torch._dynamo.device_interface import register_interface_for_device

    from .. import flagos
    from .device_interface import FlagosInterface

    register_interface_for_device("flagos", FlagosInterface)
    for i in range(flagos.device_count()):
        register_interface_for_device(f"flagos:{i}", FlagosInterface)


def _register_dynamo_backend() -> None:
    from . import backend

    backend.register()


def _register_gpu_type() -> None:
    from . import _compat

    _compat.add_gpu_type("flagos")


_pending = {}  # module name -> what to register once that module has been executed


def _run(name: str) -> None:
    callback = _pending.pop(name, None)
    if callback is None:
        return
    if not _pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    try:
        callback()
    except Exception as e:  # noqa: BLE001 - must not break torch's own import
        warnings.warn(
            f"torch_fl could not register the flagos device with {name} ({type(e).__name__}: {e}); "
            "torch.compile on flagos tensors will fail",
            RuntimeWarning,
            stacklevel=2,
        )


class _RunAfterExec(importlib.abc.Loader):
    """Executes a module with its own loader, then runs the registration for it."""

    def __init__(self, loader, name: str):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its real loader (inspect and linecache ask it for
        # source): only the execution passes through here.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run(self._name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds watched modules with the other finders and wraps their loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RunAfterExec(spec.loader, fullname)
                return spec
        return None


_finder = _AfterImportFinder()


def install() -> None:
    """Arranges the lazy registrations; cheap and idempotent."""
    from .. import _C

    after_import = {
        "torch._dynamo.device_interface": _register_dynamo_interface,
        "torch._dynamo.backends.registry": _register_dynamo_backend,
    }
    if _C._driver_name() == "cuda":
        after_import["torch._inductor.utils"] = _register_gpu_type
    with _lock:
        for name, callback in after_import.items():
            if name in sys.modules:
                _pending[name] = callback
                _run(name)
            elif name not in _pending:
                _pending[name] = callback
        if _pending and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


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
