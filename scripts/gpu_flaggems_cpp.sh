#!/usr/bin/env bash
# One device run that validates and measures the C++ launch path of FlagGems
# kernels (issue 13, docs/flaggems_cpp.md) on a GPU machine, in about 9
# minutes on an H100 with 16 cores. Usage, from the repo root (the carried
# wheels in .whl/ are installed first, by scripts/gpu_setup.sh as for gpu_check.sh):
#   bash scripts/gpu_flaggems_cpp.sh          (or: bash scripts/gpu_check.sh flaggems-cpp)
# Steps, each bounded by what is left of FLAGOS_GPU_BUDGET_S (default 560 s):
#  1. build (cuda driver);
#  2. in parallel: tests/python/test_flaggems_cpp.py (bit-equality of every
#     C++-launched operator with FlagGems' Python path, strict verification)
#     in 8 shards; the Qwen3 end-to-end tests under default routing and
#     stub-only mode; test_flaggems.py without the slow OpInfo sweep;
#  3. benchmarks, the GPU to themselves: per-op host time (bench/flaggems_ops.py),
#     first-call cost cold vs warm caches (bench/flaggems_first_call.py), Qwen3
#     generate tokens/s and training step time (bench/qwen3.py);
#  4. a summary table (scripts/flaggems_cpp_summary.py), printed last.
# Logs and JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
BUDGET=${FLAGOS_GPU_BUDGET_S:-560}
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
gpu_env_extra() {  # more lines of env.txt (scripts/gpu_setup.sh)
  python3 -c "import triton; print('triton', triton.__version__)"
  python3 -c "import importlib.metadata as m; print('flag_gems', m.version('flag_gems'))"
}
echo "== build"
source scripts/gpu_setup.sh
# Shared caches for this run (the first-call benchmark uses its own, empty ones).
CACHE=/tmp/flaggems-cpp-run
export TRITON_CACHE_DIR=$CACHE/triton FLAGOS_CACHE_DIR=$CACHE/flagos
mkdir -p "$CACHE"
python3 -c "import torch, torch_fl; print('driver', torch_fl.driver(), '| C++ ops', len(torch_fl.flaggems.cpp_ops()), '| Python ops', len(torch_fl.flaggems.registered_ops()))" 2>&1 | tee -a "$OUT/env.txt"

echo "== tests ($(left) s left)"
T=$(( $(left) - 240 ))  # keep ~240 s for the benchmarks
[ "$T" -lt 120 ] && T=120
pids=()
start_flaggems_cpp_shards "$T" "$CACHE" cpp_shard
FLAGGEMS_CACHE_DIR=$CACHE/flaggems-e2e FLAGOS_QWEN3_PARALLEL=4 timeout "$T" python3 -m pytest -q -rfs \
  -p no:cacheprovider tests/python/test_qwen3.py -m cuda -k "default or stub_only" \
  > "$OUT/qwen3_e2e.log" 2>&1 &
pids+=($!)
FLAGGEMS_CACHE_DIR=$CACHE/flaggems-fg timeout "$T" python3 -m pytest -q -rfs -p no:cacheprovider \
  tests/python/test_flaggems.py -m "not slow" > "$OUT/flaggems_tests.log" 2>&1 &
pids+=($!)
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "tests: $(( $(date +%s) - START )) s elapsed"

export FLAGGEMS_CACHE_DIR=$CACHE/flaggems-bench
echo "== per-op host time ($(left) s left)"
timeout $(( $(left) > 200 ? 90 : 60 )) python3 bench/flaggems_ops.py --rounds 5 --json "$OUT/flaggems_ops.json" \
  > "$OUT/flaggems_ops.log" 2>&1 || echo "flaggems_ops: exit $? (see flaggems_ops.log)"
echo "== first-call cost, cold vs warm caches ($(left) s left)"
if [ "$(left)" -gt 100 ]; then
  timeout $(( $(left) - 90 > 110 ? 110 : $(left) - 90 )) python3 bench/flaggems_first_call.py \
    --json "$OUT/first_call.json" > "$OUT/first_call.log" 2>&1 || echo "first_call: exit $?"
else
  echo "skipped: out of time" | tee "$OUT/first_call.log"
fi
echo "== Qwen3 generate and training ($(left) s left)"
# It needs about 5 minutes; with less left, `bash scripts/gpu_check.sh models` runs it in its own call.
if [ "$(left)" -gt 300 ]; then
  timeout $(( $(left) - 15 )) python3 bench/qwen3.py --configs "flagos all-cuda" flagos \
    --warmup 1 --rounds 3 --train-rounds 1 --steps 5 --json "$OUT/qwen3.json" > "$OUT/qwen3.log" 2>&1 \
    || echo "qwen3: exit $? (see qwen3.log)"
else
  echo "skipped: less than 300 s left (bash scripts/gpu_check.sh models runs it)" | tee "$OUT/qwen3.log"
fi
echo "total: $(( $(date +%s) - START )) s"
python3 scripts/flaggems_cpp_summary.py "$OUT"
exit $rc
