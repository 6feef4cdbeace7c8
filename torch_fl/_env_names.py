"""The FLAGOS_* environment variables torch_fl knows, and a warning for the others.

A misspelled name (``FLAGOS_BACKEND_CONFG``) would otherwise be ignored and the
program run with the defaults. Names torch_fl reads are checked for their values
where they are read (the driver, routing, observers); this module only checks
that each ``FLAGOS_*`` name in the environment is one of them, or one of the
project's build and test tools, and names the closest known one otherwise.
``FLAGOS_OP_<operator>`` names are checked by routing (unknown operators raise).
"""

from __future__ import annotations

import difflib
import os
import warnings

# Read by torch_fl at run time (docs/routing.md, docs/tuning.md, README).
RUNTIME = frozenset({
    "FLAGOS_ACCELERATOR",
    "FLAGOS_AUTOLOAD",
    "FLAGOS_BACKEND_CONFIG",
    "FLAGOS_CACHE_DIR",
    "FLAGOS_CONFIG_STRICT",
    "FLAGOS_CPU_FALLBACK",
    "FLAGOS_DISABLE_FLAGGEMS_PY",
    "FLAGOS_FLAGGEMS_CPP",
    "FLAGOS_FLAGGEMS_UNUSED",
    "FLAGOS_FLAGGEMS_VERIFY",
    "FLAGOS_HOST_DEVICES",
    "FLAGOS_HOST_MEMORY_LIMIT",
    "FLAGOS_LOG_DISPATCH",
    "FLAGOS_LOG_FILE",
    "FLAGOS_REPORT",
    "FLAGOS_TUNE",
    "FLAGOS_VERIFY",
})

# Read by the build (CMake, scripts/bootstrap.sh, scripts/pgo_build.sh) and by
# the project's tests, benchmarks and GPU scripts: set in the environment of a
# process that imports torch_fl, they are not mistakes.
TOOLS = frozenset({
    "FLAGOS_BUILD_PYTHON",
    "FLAGOS_BUILD_TESTS",
    "FLAGOS_CUDA",
    "FLAGOS_GPU_BUDGET_S",
    "FLAGOS_OFFLINE_PYTHON",
    "FLAGOS_PGO",
    "FLAGOS_PGO_DIR",
    "FLAGOS_PGO_STEP",
    "FLAGOS_QWEN3_PARALLEL",
    "FLAGOS_REBUILD",
    "FLAGOS_REPORT_DIR",
    "FLAGOS_SANITIZE",
    "FLAGOS_SWEEP_PART",
    "FLAGOS_SWEEP_SEED",
    "FLAGOS_SWEEP_VARIANTS",
    "FLAGOS_TEST_INT",
    "FLAGOS_TEST_SEED",
    "FLAGOS_TEST_SHARD",
    "FLAGOS_TEST_SIZE",
    "FLAGOS_VENV",
})

KNOWN = RUNTIME | TOOLS
_ROUTE_PREFIX = "FLAGOS_OP_"


def unknown_names(environ=None) -> list[str]:
    """The FLAGOS_* names in `environ` (default os.environ) torch_fl does not know, sorted."""
    env = os.environ if environ is None else environ
    return sorted(n for n in env
                  if n.startswith("FLAGOS_") and not n.startswith(_ROUTE_PREFIX) and n not in KNOWN)


def message(name: str) -> str:
    """The warning for one unknown name: the closest known name, or the runtime list."""
    # torch_fl's own names first: a near miss of a tool's name is rarer.
    guess = (difflib.get_close_matches(name, sorted(RUNTIME), n=1, cutoff=0.8)
             or difflib.get_close_matches(name, sorted(TOOLS), n=1, cutoff=0.9))
    hint = (f"did you mean {guess[0]}?" if guess
            else "torch_fl reads " + ", ".join(sorted(RUNTIME)) + ", and FLAGOS_OP_<operator>")
    return f"torch_fl: unknown environment variable {name} is ignored; {hint}"


def warn_unknown(environ=None) -> None:
    """One warning per unknown FLAGOS_* name (at import)."""
    for name in unknown_names(environ):
        warnings.warn(message(name), UserWarning, stacklevel=3)
