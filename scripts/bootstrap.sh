# Sourced by the README commands: creates the pinned virtual environment
# (.venv, or $FLAGOS_VENV), installs the build prerequisites, then builds and
# installs torch_fl into it. Safe to run again: each step is skipped when done.
set -euo pipefail
for var in FLAGOS_PGO FLAGOS_REBUILD; do
  case "${!var:-0}" in
    0|1) ;;
    *) echo "[bootstrap] $var='${!var}': valid values are 0 (the default) and 1" >&2; exit 2 ;;
  esac
done
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLAGOS_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "[bootstrap] creating $VENV"
  python3 -m venv "$VENV"
fi
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-dev.txt"

# FLAGOS_PGO=1: a profile-guided build (scripts/pgo_build.sh; GCC 10 or later), about twice the
# build time for about one hundredth off the per-op ratios (docs/benchmarks.md). Either build
# is skipped when the environment holds one made from the same inputs (the stamp below; in a
# git checkout only); FLAGOS_REBUILD=1 builds regardless. cmake/pgo.cmake refuses a compiler
# that cannot profile, naming it.
pgo=${FLAGOS_PGO:-0}
stamp_file="$VENV/.torch_fl_build"
stamp=""
if [ "${FLAGOS_REBUILD:-0}" != 1 ] && git -C "$ROOT" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  # Every input of the build: the checkout but for what no build reads (so a new file counts
  # until excluded here), the compiler and CMake settings of the environment, whether nvcc is
  # there (FLAGOS_CUDA=AUTO), torch's version.
  sources=$( (cd "$ROOT" && git ls-files -co --exclude-standard -z -- . ':!docs' ':!tests' ':!bench' \
               ':!examples' | xargs -0 -r sha256sum 2>/dev/null) | sha256sum | cut -c1-16) || sources=""
  torch_version=$("$PY" -m pip show torch 2>/dev/null | sed -n 's/^Version: //p') || torch_version=""
  if [ -n "$sources" ]; then
    stamp="pgo=$pgo torch=$torch_version sources=$sources cxx=${CXX:-} cc=${CC:-} cmake_args=${CMAKE_ARGS:-}"
    stamp+=" nvcc=$(command -v nvcc || true)"
  fi
fi
if [ -n "$stamp" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
   "$PY" -m pip show -q torch_fl > /dev/null 2>&1; then
  echo "[bootstrap] torch_fl is installed from these sources already"
else
  rm -f "$stamp_file"
  if [ "$pgo" = 1 ]; then
    echo "[bootstrap] building and installing torch_fl (profile-guided)"
    bash "$ROOT/scripts/pgo_build.sh" pip "$PY"
  else
    echo "[bootstrap] building and installing torch_fl"
    "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$ROOT"
  fi
  if [ -n "$stamp" ]; then echo "$stamp" > "$stamp_file"; fi
fi
export PATH="$VENV/bin:$PATH"
