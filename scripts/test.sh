#!/usr/bin/env bash
# Sets up from nothing and runs every test: the C++ unit tests (GoogleTest,
# through ctest) and the Python suite (pytest) against the installed package.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"

# GoogleTest and clang (libFuzzer) from Debian's packages; root or sudo needed.
if [ ! -f /usr/include/gtest/gtest.h ] || ! command -v clang++ >/dev/null; then
  echo "[test] installing libgtest-dev and clang"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq libgtest-dev clang >/dev/null
fi

echo "[test] C++ unit tests"
cmake -S . -B build/cpp-tests -G Ninja -DFLAGOS_BUILD_PYTHON=OFF \
  -DFLAGOS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/cpp-tests
ctest --test-dir build/cpp-tests --output-on-failure

echo "[test] fuzzing the routing-config parser (libFuzzer, ASan+UBSan, 30 s)"
CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DFLAGOS_BUILD_PYTHON=OFF \
  -DFLAGOS_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/fuzz --target fuzz_route_config
corpus=$(mktemp -d)
cp tests/cpp/fuzz_corpus/* "$corpus"/
build/fuzz/tests/cpp/fuzz_route_config -max_total_time=30 -max_len=2048 \
  "$corpus" 2>&1 | tail -n 2
rm -rf "$corpus"

echo "[test] Python tests"
# pytest (not python -m pytest): the source tree must not shadow the
# installed package on sys.path.
"$VENV/bin/pytest" tests/python -q -rs "$@"

echo "[test] sanitizers: ASan+UBSan (C++ units, Python slice), TSan (C++ concurrency)"
PYTHON="$VENV/bin/python" bash scripts/sanitize.sh
