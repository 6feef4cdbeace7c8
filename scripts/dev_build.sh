#!/usr/bin/env bash
# Developer loop: incremental build into build/dev and copy the binaries into
# the source tree, so that PYTHONPATH=. imports the fresh torch_fl. Not used
# by the README commands (they install the package properly).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ ! -f build/dev/build.ninja ]; then
  cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$PY" ${CMAKE_ARGS:-}
fi
ninja -C build/dev
cp build/dev/_C*.so torch_fl/
mkdir -p torch_fl/lib && cp build/dev/libtorch_fl.so torch_fl/lib/
if [ -f build/dev/libtorch_fl_aoti.so ]; then  # absent when this torch's torchgen could not generate it
  mkdir -p torch_fl/include
  cp build/dev/libtorch_fl_aoti.so torch_fl/lib/
  cp csrc/inductor/flagos_aoti.h build/dev/generated/inductor/c_shim_flagos.h torch_fl/include/
fi
