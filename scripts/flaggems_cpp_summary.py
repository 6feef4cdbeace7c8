"""Prints the short summary of a scripts/gpu_flaggems_cpp.sh run from the files in its $OUT.

    python3 scripts/flaggems_cpp_summary.py OUT_DIR
"""

import glob
import json
import os
import re
import sys


def last_result(path):
    """pytest's final 'N passed, M failed ...' line, or what went wrong."""
    if not os.path.exists(path):
        return "not run"
    text = open(path, errors="replace").read()
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped)", ln)]
    if lines:
        return lines[-1].strip("= ")
    return "no result (timed out or crashed): " + (text.strip().splitlines() or [""])[-1][:120]


def failures(path, n=6):
    if not os.path.exists(path):
        return []
    return [ln[:220] for ln in open(path, errors="replace").read().splitlines()
            if ln.startswith(("FAILED", "ERROR"))][:n]


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main(out):
    print("\n================ FlagGems C++ launch path: summary ================")
    env = os.path.join(out, "env.txt")
    if os.path.exists(env):
        print(" | ".join(ln.strip() for ln in open(env) if ln.strip()))
    print("\n-- tests")
    shards = sorted(glob.glob(os.path.join(out, "cpp_shard*.log")))
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for s in shards:
        r = last_result(s)
        for k in totals:
            m = re.search(rf"(\d+) {k}", r)
            totals[k] += int(m.group(1)) if m else 0
        if "no result" in r:
            print(f"  {os.path.basename(s)}: {r}")
    print(f"  bit-equality (test_flaggems_cpp.py, {len(shards)} shards): "
          + ", ".join(f"{v} {k}" for k, v in totals.items() if v))
    for s in shards:
        for f in failures(s, 3):
            print(f"    {f}")
    print(f"  Qwen3 e2e, default + stub-only (test_qwen3.py -m cuda): {last_result(os.path.join(out, 'qwen3_e2e.log'))}")
    for f in failures(os.path.join(out, "qwen3_e2e.log")):
        print(f"    {f}")
    print(f"  test_flaggems.py (not slow): {last_result(os.path.join(out, 'flaggems_tests.log'))}")
    for f in failures(os.path.join(out, "flaggems_tests.log")):
        print(f"    {f}")

    ops = load(os.path.join(out, "flaggems_ops.json"))
    print("\n-- per-op host time, us (median of rounds; ratio vs native CUDA eager; * device-bound)")
    if ops:
        print(f"  {'op':<34} {'c++':>7} {'python':>7} {'cuda':>7} {'c++/cu':>7} {'py/cu':>6}")
        for r in ops["rows"]:
            if "calls" not in r:
                print(f"  {r['op']:<34} {'':>7} {'':>7} {'':>7} {r['flagos/cuda']:>7.2f}")
                continue
            mark = "*" if r["device_bound"] else " "
            print(f"  {r['op'][:34]:<34} {r['flagos_us']:>7.1f} {r['flagos-python_us']:>7.1f} "
                  f"{r['cuda_us']:>7.1f} {r['flagos/cuda']:>6.2f}{mark} {r['python/cuda']:>6.2f}")
        m = ops["meta"]
        if m.get("cpp_not_bitwise_python"):
            print(f"  WARNING c++ != python bits: {m['cpp_not_bitwise_python']}")
        if m.get("results_differ_from_cuda"):
            print(f"  WARNING differs from CUDA: {m['results_differ_from_cuda']}")
        pinned = m.get("cpp_stats", {}).get("pinned")
        if pinned:
            print(f"  pinned to Python: {pinned[:4]}")
    else:
        print("  not run (see flaggems_ops.log)")

    fc = load(os.path.join(out, "first_call.json"))
    print("\n-- first-call cost: sum of first calls of 8 ops, each config a fresh process")
    if fc:
        for c, t in fc["totals_s"].items():
            print(f"  {c:<24} {t * 1e3:>8.0f} ms   (median op {fc['median_first_ms'][c]:.1f} ms)")
    else:
        print("  not run (see first_call.log)")

    q = load(os.path.join(out, "qwen3.json"))
    print("\n-- Qwen3 0.6b: generate (bf16) tokens/s and training step time, x native CUDA")
    if q:
        inf, tr = q.get("inference", {}), q.get("training", {})
        for key, row in inf.items():
            if not key.startswith("batch"):
                continue
            for c, r in row.items():
                print(f"  generate {key:<8} {c:<16} {r['tok_s']:>8.1f} tok/s  x cuda {r['ratio']:.3f}  "
                      f"tokens equal {r['tokens_equal_cuda']}/{r['tokens']}")
            if "flagos" in row and "flagos all-cuda" in row:
                print(f"  generate {key}: default vs all-cuda "
                      f"{row['flagos']['tok_s'] / row['flagos all-cuda']['tok_s']:.3f}x (>= 1: default as fast)")
        for mode, row in tr.items():
            for c, r in row.items():
                print(f"  train {mode:<13} {c:<16} {r['step_ms']:>8.1f} ms  x cuda {r['ratio']:.3f}  "
                      f"losses equal {r['losses_equal_cuda']}")
            if "flagos" in row and "flagos all-cuda" in row:
                print(f"  train {mode}: default vs all-cuda "
                      f"{row['flagos all-cuda']['step_ms'] / row['flagos']['step_ms']:.3f}x (>= 1: default as fast)")
        if inf.get("flaggems_cpp"):
            s = inf["flaggems_cpp"]
            print(f"  FlagGems from C++: {s['launched']} launches, {s['captures']} captures, pinned {s['pinned'][:3]}")
        if inf.get("flaggems_python_ops"):
            print(f"  FlagGems through Python (calls): {inf['flaggems_python_ops']}")
    else:
        print("  not run (see qwen3.log)")
    print("===================================================================")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/flagos-gpu")
