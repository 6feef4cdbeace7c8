"""Qwen3 with a tuned routing config, against default routing and all-cuda.

Step 1, tuning: ``python -m torch_fl tune`` runs one pass of the workload of
bench/qwen3.py (greedy generation in bfloat16 and AdamW training steps in
float32, one process) and writes tuned.conf and tune-data.json.

Step 2, measurement: each configuration runs bench/qwen3.py's child workload in
its own process (W warm-up generations, R timed ones, S training steps; medians
as in bench/qwen3.py):

- ``default``: flagos, default routing (FlagGems where it serves an operator);
- ``default (A/A)``: the same again, in another process: the method's noise;
- ``all-cuda``: flagos with ``* = cuda``;
- ``tuned``: flagos with FLAGOS_BACKEND_CONFIG=tuned.conf;
- ``cuda``: native CUDA, torch_fl not loaded (the reference for tokens).

The configurations run ``--rounds`` times, in an order reversed every other
round. Per round the ratios tuned/default, tuned/all-cuda and A/A are taken
per metric; the medians over rounds are reported (tokens/s: >1 is faster;
step time: <1 is faster). The tuned config meets the bar when it is at least
as fast as the faster of default and all-cuda, within the A/A noise.

    PYTHONPATH=. python bench/tuned_qwen3.py [--size 0.6b] [--rounds 3] [--outdir DIR] [--json out.json]

Without a GPU it prints "skipped: ..." and exits with status 0.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
QWEN3 = os.path.join(HERE, "qwen3.py")
CONFIGS = ("default", "default (A/A)", "all-cuda", "tuned", "cuda")
METRICS = ("prefill_tok_s", "decode_tok_s", "train_step_s")
FASTER_IS_HIGHER = {"prefill_tok_s": True, "decode_tok_s": True, "train_step_s": False}


def workload_args(a, warmup, repeats, steps) -> list:
    return ["--size", a.size, "--batch", str(a.batch), "--prompt-len", str(a.prompt_len),
            "--new-tokens", str(a.new_tokens), "--warmup", str(warmup), "--repeats", str(repeats),
            "--steps", str(steps)]


def env_for(config: str, files: dict) -> dict:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # children run elsewhere: keep PYTHONPATH=. pointing here
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(x) for x in
                                            env["PYTHONPATH"].split(os.pathsep) if x)
    env.pop("FLAGOS_BACKEND_CONFIG", None)
    for k in [k for k in env if k.startswith("FLAGOS_OP_")]:
        env.pop(k)
    if config == "cuda":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    elif config == "all-cuda":
        env["FLAGOS_BACKEND_CONFIG"] = files["all-cuda"]
    elif config == "tuned":
        env["FLAGOS_BACKEND_CONFIG"] = files["tuned"]
    return env


def run_config(a, config: str, files: dict) -> dict:
    child = "cuda" if config == "cuda" else "flagos"
    cmd = [sys.executable, QWEN3, "--child", child,
           *workload_args(a, a.warmup, a.repeats, a.steps)]
    p = subprocess.run(cmd, env=env_for(config, files), capture_output=True, text=True,
                       timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("@@qwen3 "):
            return json.loads(line[len("@@qwen3 "):])
    raise RuntimeError(f"{config}: exited {p.returncode}\n{p.stderr[-3000:]}")


def tune(a, outdir: str) -> dict:
    conf = os.path.join(outdir, "tuned.conf")
    data = os.path.join(outdir, "tune-data.json")
    # One pass: one generation (its first call of each shape is measured) and
    # three training steps (forward, backward and optimizer shapes).
    cmd = [sys.executable, "-m", "torch_fl", "tune", "--out", conf, "--data", data,
           "--budget-ms", str(a.budget_ms), *(["--verify"] if a.verify else []), "--",
           sys.executable, QWEN3, "--child", "flagos", *workload_args(a, 0, 1, 3)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env_for("default", {}), capture_output=True, text=True,
                       timeout=3600, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"tune failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    print(p.stdout, flush=True)
    report = os.path.join(outdir, "tuned_qwen3_report.html")
    png = os.path.join(outdir, "tuned_qwen3_plot.png")
    for out in (report, png):
        subprocess.run([sys.executable, "-m", "torch_fl", "report", "--from", data, "--out", out],
                       check=True, cwd=ROOT)
    return {"conf": conf, "data": data, "report": report, "plot": png,
            "seconds": time.monotonic() - t0, "summary": p.stdout}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="0.6b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-ms", type=float, default=10.0, help="tune's timing budget")
    p.add_argument("--verify", action="store_true", help="tune with --verify")
    p.add_argument("--tuned", help="use this tuned config instead of tuning (step 1 skipped)")
    p.add_argument("--outdir", help="keep tuned.conf, tune-data.json, the report and its plot here")
    p.add_argument("--json")
    a = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        return 0
    t_start = time.monotonic()
    outdir = a.outdir or tempfile.mkdtemp(prefix="tuned-qwen3-")
    os.makedirs(outdir, exist_ok=True)
    files = {"all-cuda": os.path.join(outdir, "all-cuda.conf")}
    with open(files["all-cuda"], "w") as f:
        f.write("* = cuda\n")
    if a.tuned:
        files["tuned"] = os.path.abspath(a.tuned)
        tuned = {"conf": files["tuned"]}
    else:
        tuned = tune(a, outdir)
        files["tuned"] = tuned["conf"]

    runs = {c: [] for c in CONFIGS}
    for r in range(a.rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for c in order:
            runs[c].append(run_config(a, c, files))
            x = runs[c][-1]
            print(f"round {r + 1} {c}: prefill {x['prefill_tok_s']:.0f} tok/s, decode "
                  f"{x['decode_tok_s']:.1f} tok/s, train step {x['train_step_s'] * 1e3:.1f} ms",
                  flush=True)

    med = statistics.median
    rows = {c: {m: med(x[m] for x in runs[c]) for m in METRICS} for c in CONFIGS}
    for c in CONFIGS:
        rows[c]["tokens_equal_cuda"] = runs[c][-1]["tokens"] == runs["cuda"][-1]["tokens"]
        rows[c]["routing"] = runs[c][-1].get("routing")

    def ratio(x, y):  # median over rounds of the per-round ratio x/y
        return {m: med(rx[m] / ry[m] for rx, ry in zip(runs[x], runs[y])) for m in METRICS}

    ratios = {"tuned / default": ratio("tuned", "default"),
              "tuned / all-cuda": ratio("tuned", "all-cuda"),
              "A/A (default / default)": ratio("default (A/A)", "default"),
              "tuned / cuda": ratio("tuned", "cuda")}
    print(f"\nQwen3 {a.size} (random weights), {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}; inference bf16 B={a.batch} P={a.prompt_len} N={a.new_tokens}, "
          f"training fp32 AdamW B={a.batch} L={a.prompt_len}; {a.rounds} round(s), "
          f"{time.monotonic() - t_start:.0f} s")
    print(f"{'config':<15} {'prefill tok/s':>14} {'decode tok/s':>13} {'train step ms':>14} "
          f"{'tokens = cuda':>14}")
    for c in CONFIGS:
        r = rows[c]
        print(f"{c:<15} {r['prefill_tok_s']:>14.0f} {r['decode_tok_s']:>13.1f} "
              f"{r['train_step_s'] * 1e3:>14.1f} {str(r['tokens_equal_cuda']):>14}")
    print(f"\n{'ratio (median of rounds)':<26} {'prefill':>9} {'decode':>9} {'step time':>10}")
    for name, q in ratios.items():
        print(f"{name:<26} {q['prefill_tok_s']:>9.3f} {q['decode_tok_s']:>9.3f} "
              f"{q['train_step_s']:>10.3f}")
    print("tokens/s ratios: >1 is faster; step-time ratio: <1 is faster")
    verdict = {}
    for m in METRICS:
        noise = abs(ratios["A/A (default / default)"][m] - 1)
        best_other = max if FASTER_IS_HIGHER[m] else min
        other = best_other(rows["default"][m], rows["all-cuda"][m])
        rel = rows["tuned"][m] / other
        ok = rel >= 1 - noise if FASTER_IS_HIGHER[m] else rel <= 1 + noise
        verdict[m] = {"tuned_vs_best_other": rel, "aa_noise": noise, "meets_bar": ok}
        print(f"{m}: tuned / best of default and all-cuda = {rel:.3f} (A/A noise {noise:.3f}): "
              f"{'meets the bar' if ok else 'SLOWER than the faster of default and all-cuda'}")
    if not a.tuned:
        print(f"\ntuned config, data, report and plot: {outdir}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                                "args": vars(a), "gpu": torch.cuda.get_device_name(0),
                                "torch": torch.__version__},
                       "tuned": {k: v for k, v in tuned.items() if k != "summary"},
                       "tuned_config": open(files["tuned"]).read(),
                       "rows": rows, "ratios": ratios, "verdict": verdict, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
