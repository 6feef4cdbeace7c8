#!/usr/bin/env bash
# Developer loop: incremental build into build/dev and copy the binaries into
# the source tree, so that PYTHONPATH=. imports the fresh torch_fl. Not used
# by the README commands (they install the package properly).
# FLAGOS_PGO_STEP=generate|use builds that step of a profile-guided build
# (cmake/pgo.cmake; scripts/pgo_build.sh runs the steps); unset, a plain build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
pgo=${FLAGOS_PGO_STEP:-}
cached=$(sed -n 's/^FLAGOS_PGO:STRING=//p' build/dev/CMakeCache.txt 2>/dev/null || true)
if [ ! -f build/dev/build.ninja ]; then
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$PY" "-DFLAGOS_PGO=$pgo" ${CMAKE_ARGS:-}
elif [ "$cached" != "$pgo" ]; then
  cmake -S . -B build/dev "-DFLAGOS_PGO=$pgo"
fi
ninja -C build/dev
cp build/dev/_C*.so torch_fl/
mkdir -p torch_fl/lib && cp build/dev/libtorch_fl.so torch_fl/lib/
if [ -f build/dev/libtorch_fl_aoti.so ]; then  # absent when this torch's torchgen could not generate it
  mkdir -p torch_fl/include
  cp build/dev/libtorch_fl_aoti.so torch_fl/lib/
  cp csrc/inductor/flagos_aoti.h build/dev/generated/inductor/c_shim_flagos.h torch_fl/include/
fi
