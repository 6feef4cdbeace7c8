# Sourced by the README commands: creates the pinned virtual environment
# (.venv, or $FLAGOS_VENV), installs the build prerequisites, then builds and
# installs torch_fl into it. Safe to run again: each step is skipped when done.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLAGOS_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "[bootstrap] creating $VENV"
  python3 -m venv "$VENV"
fi
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements-dev.txt"

echo "[bootstrap] building and installing torch_fl"
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps "$ROOT"
export PATH="$VENV/bin:$PATH"
