#!/usr/bin/env bash
# Builds torch_fl with profile-guided optimisation (cmake/pgo.cmake) in three
# steps: an instrumented build; scripts/pgo_workload.py on the flagos device,
# every operator on the driver's own kernels, which writes the profile; the
# build that uses it. Both builds run in one build tree, as the profile needs.
#   scripts/pgo_build.sh pip PYTHON   install into PYTHON's environment (scripts/bootstrap.sh)
#   scripts/pgo_build.sh dev PYTHON   build/dev, copied into the source tree (scripts/dev_build.sh)
# Needs GCC; the workload runs on the driver this machine has (host or cuda).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=${1:-}; PY=${2:-}
case "$mode" in
  pip|dev) ;;
  *) echo "pgo_build.sh: unknown mode '$mode'; choose pip or dev" >&2; exit 2 ;;
esac
[ -x "$PY" ] || { echo "pgo_build.sh: '$PY' is not an executable Python" >&2; exit 2; }
# pip builds in build/<wheel tag>, whose name this script does not know: it names the directory.
profile="$ROOT/build/pgo-profile-pip"

build() {  # the step: generate or use
  if [ "$mode" = pip ]; then
    "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps \
      -C "cmake.define.FLAGOS_PGO=$1" -C "cmake.define.FLAGOS_PGO_DIR=$profile" "$ROOT"
  else
    FLAGOS_PGO_STEP=$1 PYTHON="$PY" bash "$ROOT/scripts/dev_build.sh"
    profile=$(sed -n 's/^FLAGOS_PGO_DIR:PATH=//p' "$ROOT/build/dev/CMakeCache.txt")
  fi
}

if [ "$mode" = dev ] && grep -qx 'FLAGOS_PGO:STRING=use' "$ROOT/build/dev/CMakeCache.txt" 2>/dev/null &&
   ninja -C "$ROOT/build/dev" -n 2>/dev/null | grep -q "no work to do"; then
  echo "[pgo] build/dev is a profile-guided build of these sources already"
  build use  # nothing to compile: copies the binaries back
  exit 0
fi
echo "[pgo] instrumented build"
build generate
# Counters of an older build would be merged into the new profile. Only the profile's files go:
# the directory is the user's to name.
if [ -d "$profile" ]; then find "$profile" -name '*.gcda' -delete; fi
echo "[pgo] training workload"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
printf '* = native\n' > "$work/native.conf"
# From outside the source tree, so that pip mode imports the installed package.
(cd "$work" && if [ "$mode" = dev ]; then export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"; fi &&
  FLAGOS_BACKEND_CONFIG="$work/native.conf" "$PY" "$ROOT/scripts/pgo_workload.py")
if [ -z "$(find "$profile" -name '*.gcda' -print -quit 2>/dev/null)" ]; then
  echo "pgo_build.sh: the workload wrote no profile to $profile" >&2; exit 1
fi
echo "[pgo] optimised build"
build use
