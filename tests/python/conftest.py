"""Shared setup for the torch_fl Python tests.

FLAGOS_HOST_DEVICES must be set before torch_fl (and so the driver) is
imported: the host driver reads it once. Two devices make the multi-device
tests meaningful; an explicit value in the environment wins.
"""

import contextlib
import os
import re
import subprocess
import tempfile
import sys

os.environ.setdefault("FLAGOS_HOST_DEVICES", "2")

# A FlagGems disk cache of the test process's own (unless one is given), read
# like FLAGOS_HOST_DEVICES at import. The FlagGems tests compare the C++ launch
# with FlagGems' Python path in one process; a config of an autotuned kernel
# learned by another process (the user's warm cache, a parallel test shard) is
# what FlagGems' timed autotuner chose there, not necessarily here. It also
# keeps the tests out of the user's ~/.cache.
if "FLAGOS_CACHE_DIR" not in os.environ:
    import atexit
    import shutil

    _cache_dir = tempfile.mkdtemp(prefix="torch_fl-test-cache-")
    os.environ["FLAGOS_CACHE_DIR"] = _cache_dir
    atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_fl  # noqa: E402,F401  (registers the flagos device)

_SUBPROCESS_TIMEOUT_S = 120


def _child_env(env: dict | None) -> dict:
    child_env = dict(os.environ)
    # Children run in a temporary directory: relative PYTHONPATH entries
    # (PYTHONPATH=. in the developer loop) must stay pointed at the checkout.
    if child_env.get("PYTHONPATH"):
        child_env["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(p) for p in child_env["PYTHONPATH"].split(os.pathsep) if p)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = str(value)
    return child_env


class PyProcess:
    """A Python snippet running in a fresh interpreter (see :func:`start_py`)."""

    def __init__(self, args, env: dict | None, timeout: float):
        self._timeout = timeout
        self._proc = subprocess.Popen(
            [sys.executable, *args],
            env=_child_env(env),
            stdout=subprocess.PIPE,
            # Outside the source tree: `-c` puts the working directory first on
            # sys.path, and the checkout's torch_fl/ has no built extension.
            cwd=tempfile.gettempdir(),
            stderr=subprocess.PIPE,
            text=True,
        )
        self._result = None

    def result(self):
        """Waits for the child; returns (returncode, stdout, stderr)."""
        if self._result is None:
            try:
                out, err = self._proc.communicate(timeout=self._timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                out, err = self._proc.communicate()
                raise AssertionError(
                    f"subprocess timed out after {self._timeout}s\n{out}\n{err}"
                ) from None
            self._result = (self._proc.returncode, out, err)
        return self._result


def start_py(code: str, env: dict | None = None, timeout: float = _SUBPROCESS_TIMEOUT_S,
             module: str | None = None) -> PyProcess:
    """Starts ``code`` (or ``python -m module``) in a fresh interpreter, without waiting.

    Importing torch costs seconds; starting several children at once and
    collecting them later keeps subprocess-heavy tests fast.
    """
    args = ["-m", module] if module is not None else ["-c", code]
    return PyProcess(args, env, timeout)


def run_py(code: str, env: dict | None = None, timeout: float = _SUBPROCESS_TIMEOUT_S):
    """Runs ``code`` in a fresh Python interpreter.

    The child inherits this process's environment (PYTHONPATH and the
    FLAGOS_HOST_DEVICES default included); ``env`` overrides entries, and a
    value of None removes the variable. Returns (returncode, stdout, stderr).
    """
    return start_py(code, env, timeout).result()


@pytest.fixture(name="run_py", scope="session")
def run_py_fixture():
    """The :func:`run_py` helper, as a fixture."""
    return run_py


@pytest.fixture(name="start_py", scope="session")
def start_py_fixture():
    """The :func:`start_py` helper, as a fixture."""
    return start_py


def _on_cuda_driver() -> bool:
    return torch_fl.driver() == "cuda"


# What a test's body or parameters say when it uses flagos:1 in this process.
# `flagos:1\b` so that 'flagos:128' (an out-of-range index) does not count.
_SECOND_DEVICE = re.compile(r"flagos:1\b|device\(1\)|set_device\(1\)")


def _uses_second_device(item) -> bool:
    """Whether ``item`` needs a second flagos device in this process.

    Judged from the test function's body (not its decorators: a parametrize
    list names every parameter set) and from this item's own parameter values.
    Tests that need one but say it otherwise carry an explicit
    ``skipif(torch.flagos.device_count() < 2)``. A module whose device work runs
    only in child processes that choose their own device count sets
    ``USES_DEVICES_IN_CHILDREN_ONLY = True``.
    """
    import inspect

    if getattr(item.module, "USES_DEVICES_IN_CHILDREN_ONLY", False):
        return False
    try:
        src = inspect.getsource(item.function)
    except (OSError, TypeError):
        return False
    body = re.search(r"^[ \t]*(async[ \t]+)?def[ \t]", src, re.M)
    if body is not None:
        src = src[body.start():]
    params = getattr(item, "callspec", None)
    in_params = params is not None and any(
        isinstance(v, str) and _SECOND_DEVICE.search(v) for v in params.params.values())
    return bool(in_params or _SECOND_DEVICE.search(src))


def pytest_collection_modifyitems(config, items):
    """`cuda` tests run only on the cuda driver; `host_only` ones only on the host
    driver; tests that use a second device (flagos:1) only where there is one
    (FLAGOS_HOST_DEVICES=2 gives the host driver two)."""
    on_cuda = _on_cuda_driver()
    skip_one = pytest.mark.skip(reason="needs two flagos devices")
    single = torch.flagos.device_count() < 2
    skip_cuda = pytest.mark.skip(reason="needs the cuda driver (an NVIDIA GPU and a CUDA build of torch)")
    skip_host = pytest.mark.skip(reason="host-driver behaviour (FLAGOS_HOST_* settings, CPU-identical results)")
    for item in items:
        if "cuda" in item.keywords and not on_cuda:
            item.add_marker(skip_cuda)
        if "host_only" in item.keywords and on_cuda:
            item.add_marker(skip_host)
        if single and _uses_second_device(item):
            item.add_marker(skip_one)


@contextlib.contextmanager
def python_kernels(kernels: dict):
    """Installs Python kernels (op name -> callable) for the flaggems backend: test-only
    overrides (host driver) that verification and tuning must see through."""
    try:
        for op, fn in kernels.items():
            assert torch_fl._C._register_python_kernel(op, fn), op
        torch_fl.routing.reload()
        yield
    finally:
        torch_fl._C._clear_python_kernels()
        torch_fl.routing.reload()
        for op in kernels:
            torch_fl.routing.set_route(op, "")
