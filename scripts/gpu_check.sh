#!/usr/bin/env bash
# One device call on the GPU machine: build torch_fl against that machine's
# torch (CUDA; incremental when build/dev is still there), then run the GPU
# tests and/or the GPU benchmarks. Logs, JSON and reports go to $OUT (the
# device tool brings them back). Usage, from the repo root:
#   bash scripts/gpu_check.sh [tests|bench|all|dist|tune|tunetrain|models|flaggems-cpp] [extra pytest args]
# flaggems-cpp runs scripts/gpu_flaggems_cpp.sh: the C++ launch path of FlagGems
# kernels validated and measured in one run (docs/flaggems_cpp.md).
# bench runs bench/cuda_overhead.py (FlagGems off: the routing path's own
# cost), bench/flaggems_ops.py and bench/qwen3.py. dist (2+ GPUs) runs the
# multigpu tests of tests/python/test_distributed.py, then bench/distributed.py
# with default routing and with every operator on CUDA's kernels. tune runs the tuning,
# verification and report tests, then bench/tuned_qwen3.py's inference half (tune, then
# tokens/s of tuned vs default vs all-cuda); tunetrain its training half (each fits the
# 10-minute limit of one device call). models runs the model-level benchmarks in
# bounded time (QWEN3_S, GRAPHS_S seconds): bench/qwen3.py (generate and training,
# flagos all-cuda and default against cuda) and bench/decode_graphs.py. The setup (carried
# wheels of .whl/, env.txt, build) is scripts/gpu_setup.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}; shift || true
[ "$what" = flaggems-cpp ] && exec bash scripts/gpu_flaggems_cpp.sh
source scripts/gpu_setup.sh
python3 -c "import torch, torch_fl; print('driver', torch_fl.driver(), 'devices', torch.flagos.device_count())"

rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  [ $# -eq 0 ] && set -- tests/python
  python3 -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$OUT/tests.log" | tail -40
  rc=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  FLAGOS_DISABLE_FLAGGEMS_PY=1 python3 bench/cuda_overhead.py --json "$OUT/cuda_overhead.json" \
    2>&1 | tee "$OUT/bench.log"
  python3 bench/flaggems_ops.py --json "$OUT/flaggems_ops.json" 2>&1 | tee -a "$OUT/bench.log"
  python3 bench/qwen3.py --json "$OUT/qwen3.json" 2>&1 | tee -a "$OUT/bench.log"
fi
if [ "$what" = tune ]; then
  python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_tuning.py \
    tests/python/test_verify.py tests/python/test_report.py "$@" 2>&1 | tee "$OUT/tune_tests.log" | tail -40
  rc=${PIPESTATUS[0]}
  python3 bench/tuned_qwen3.py --skip training --outdir "$OUT/tuned_qwen3" \
    --json "$OUT/tuned_qwen3_infer.json" 2>&1 | tee "$OUT/tune_bench.log"
fi
if [ "$what" = tunetrain ]; then
  python3 bench/tuned_qwen3.py --skip inference --outdir "$OUT/tuned_qwen3" \
    --json "$OUT/tuned_qwen3_train.json" 2>&1 | tee "$OUT/tune_train_bench.log"
fi
if [ "$what" = models ]; then
  timeout "${QWEN3_S:-300}" python3 bench/qwen3.py --configs "flagos all-cuda" flagos --rounds 3 \
    --train-rounds 1 --steps 4 --warmup 1 --json "$OUT/qwen3.json" 2>&1 | tee "$OUT/qwen3.log"
  timeout "${GRAPHS_S:-200}" python3 bench/decode_graphs.py --rounds 5 --json "$OUT/decode_graphs.json" \
    2>&1 | tee "$OUT/decode_graphs.log"
fi
if [ "$what" = dist ]; then
  # no NVLink multicast on the 2-GPU machines: every process gets these
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  python3 -m pytest -q -rs -p no:cacheprovider -m multigpu tests/python/test_distributed.py "$@" \
    2>&1 | tee "$OUT/dist_tests.log" | tail -40
  rc=${PIPESTATUS[0]}
  python3 bench/distributed.py --json "$OUT/distributed.json" --logs "$OUT/dist_logs" \
    2>&1 | tee "$OUT/dist_bench.log"
  python3 bench/distributed.py --all-cuda --json "$OUT/distributed_all_cuda.json" \
    --logs "$OUT/dist_logs_all_cuda" 2>&1 | tee -a "$OUT/dist_bench.log"
fi
exit $rc
