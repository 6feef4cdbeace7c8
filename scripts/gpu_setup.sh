# Sourced from the repo root by scripts/gpu_check.sh and scripts/gpu_flaggems_cpp.sh:
# the setup of one device call on the GPU machine. Creates $OUT, installs the
# carried wheels of .whl/ (flag_gems; see docs/gpu.md) when there are any,
# logs the environment to $OUT/env.txt (with the lines of gpu_env_extra, when
# the caller defines that function), builds torch_fl for the cuda driver
# (incremental when build/dev is still there; exits on failure) and puts it on
# PYTHONPATH with FLAGOS_REPORT_DIR=$OUT.
OUT=${OUT:-/tmp/flagos-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export PATH=/usr/local/cuda/bin:$PATH
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export GEMS_VENDOR=nvidia  # flag_gems' vendor on these machines
{ nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)";
  if declare -F gpu_env_extra >/dev/null; then gpu_env_extra; fi; nproc; } 2>&1 | tee "$OUT/env.txt"

build_start=$(date +%s)
# A plain build, as scripts/bootstrap.sh makes by default; GPU_PGO=1 builds profile-guided, as
# FLAGOS_PGO=1 does there.
if [ "${GPU_PGO:-0}" = 1 ]; then build=(scripts/pgo_build.sh dev "$(command -v python3)"); else build=(scripts/dev_build.sh); fi
if ! PYTHON=python3 CMAKE_ARGS="-DFLAGOS_CUDA=ON" bash "${build[@]}" > "$OUT/build.log" 2>&1; then
  grep -E "error|Error" "$OUT/build.log" | head -40
  exit 1
fi
echo "build: $(( $(date +%s) - build_start )) s"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} FLAGOS_REPORT_DIR=$OUT

# Starts tests/python/test_flaggems_cpp.py in 8 background shards under strict
# verification, each with a FlagGems cache of its own below $2 and bounded by
# $1 seconds; logs $OUT/<$3><shard>.log; appends the pids to the array `pids`.
start_flaggems_cpp_shards() {
  local limit=$1 cache=$2 log=$3 i
  for i in $(seq 0 7); do
    FLAGOS_TEST_SHARD=$i/8 FLAGGEMS_CACHE_DIR=$cache/flaggems$i FLAGOS_FLAGGEMS_VERIFY=strict \
      timeout "$limit" python3 -m pytest -q -rfs -p no:cacheprovider tests/python/test_flaggems_cpp.py \
      > "$OUT/$log$i.log" 2>&1 &
    pids+=($!)
  done
}
