"""Work that must follow the import of a PyTorch module torch_fl does not import itself.

Some registrations and fixes belong to modules most programs never import
(Dynamo, Inductor, torch.distributed.checkpoint), and importing them with
torch_fl would cost every program seconds. :func:`after_import` runs a callback
right after the module is first executed, through a meta-path finder that
wraps the module's own loader, or at once if the module is imported already.
"""

import importlib
import importlib.abc
import sys
import threading
import warnings

_lock = threading.RLock()
_pending = {}  # module name -> [(callback, what fails without it)]


def _run(name: str) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
        if not _pending and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for callback, consequence in callbacks:
        try:
            callback()
        except Exception as e:  # noqa: BLE001 - must not break torch's own import
            warnings.warn(
                f"torch_fl's hook for {name} failed ({type(e).__name__}: {e}); {consequence}",
                RuntimeWarning,
                stacklevel=2,
            )


class _RunAfterExec(importlib.abc.Loader):
    """Executes a module with its own loader, then runs the callbacks for it."""

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


def after_import(name: str, callback, consequence: str) -> None:
    """Runs ``callback`` once ``name`` has been executed (now, if it has been).

    ``consequence`` completes the warning given if the callback raises: what
    will not work (the import itself never fails because of a callback).
    """
    with _lock:
        entries = _pending.setdefault(name, [])
        if any(cb is callback for cb, _ in entries):
            return
        entries.append((callback, consequence))
        if name not in sys.modules and _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
    if name in sys.modules:
        # Another thread may still be executing it: importing waits for that
        # thread's import to finish (in this thread, it returns at once).
        importlib.import_module(name)
        _run(name)
