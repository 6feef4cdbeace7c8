#!/usr/bin/env bash
# Sets up from nothing and runs every test: the C++ unit tests (GoogleTest,
# through ctest) and the Python suite (pytest) against the installed package.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"

echo "[test] C++ unit tests"
cmake -S . -B build/cpp-tests -G Ninja -DFLAGOS_BUILD_PYTHON=OFF \
  -DFLAGOS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp-tests
ctest --test-dir build/cpp-tests --output-on-failure

echo "[test] Python tests"
# pytest (not python -m pytest): the source tree must not shadow the
# installed package on sys.path.
"$VENV/bin/pytest" tests/python -q -rs "$@"
