"""Qwen3 with a tuned routing config, against default routing and all-cuda.

Step 1, tuning (``python -m torch_fl tune``, docs/tuning.md), once per workload:
- inference: one HF ``generate()`` per batch size on flagos (bf16, default
  routing, --tune-new-tokens tokens: a sample of the decode shapes), in a
  child of this script; writes tuned-infer.conf;
- training: bench/qwen3.py's training child (fp32 and bf16-autocast AdamW
  steps); writes tuned-train.conf.
Each tune also writes its data file, an HTML report and the report's plot.

Step 2, measurement, as bench/qwen3.py measures (docs/benchmarks.md):
- inference in one process, sides interleaved over R rounds (rotating which
  goes first): ``default`` (flagos, default routing), ``default (A/A)`` (the
  same again: the method's noise), ``all-cuda`` (``* = cuda``), ``tuned`` (the
  tuned config's entries, installed with routing.set_route), and ``cuda``
  (native, for the tokens); the ratios are medians of per-round ratios;
- training in a process per configuration and round (a CUDA backward cannot
  run beside torch_fl, pytorch#161129): default, default (A/A), all-cuda,
  tuned (FLAGOS_BACKEND_CONFIG=tuned-train.conf), cuda.

The tuned config meets the bar when it is at least as fast as the faster of
default and all-cuda, within the A/A noise.

    PYTHONPATH=. python bench/tuned_qwen3.py [--size 0.6b] [--outdir DIR] [--json out.json]

Without a GPU it prints "skipped: ..." and exits with status 0.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXAMPLES = os.path.join(ROOT, "examples")
QWEN3 = os.path.join(HERE, "qwen3.py")
sys.path.insert(0, HERE)
import qwen3 as q  # noqa: E402  (bench/qwen3.py: the workload's arguments, the interleaved timing)
SIDES = ("default", "default (A/A)", "all-cuda", "tuned")


def child_env(extra=None) -> dict:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # children run from other directories
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in
                                            env["PYTHONPATH"].split(os.pathsep) if p)
    env.pop("FLAGOS_BACKEND_CONFIG", None)
    for k in [k for k in env if k.startswith("FLAGOS_OP_")]:
        env.pop(k)
    env.update(extra or {})
    return env


# ---- step 1: tuning -------------------------------------------------------------------

def infer_child(a) -> int:
    """The inference workload tune runs: one generate() per batch size."""
    sys.path.insert(0, EXAMPLES)
    import torch
    import qwen3_workload as wl
    import torch_fl  # noqa: F401  (the flagos device, where autoload is not installed)

    cfg = wl.SIZES[a.size]
    model = wl.build_model(a.size, torch.bfloat16, "flagos", seed=0)
    model.generation_config.pad_token_id = 0
    for batch in a.batches:  # as bench/qwen3.py's timed_generate, with no copy of the tokens
        ids = wl.prompt_ids(cfg["vocab_size"], batch, a.prompt_len, seed=batch).to("flagos")
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                           do_sample=False, use_cache=True, pad_token_id=0)
    torch.flagos.synchronize()
    return 0


def tune(a, outdir: str, name: str, workload: list) -> dict:
    conf = os.path.join(outdir, f"tuned-{name}.conf")
    data = os.path.join(outdir, f"tune-{name}-data.json")
    cmd = [sys.executable, "-m", "torch_fl", "tune", "--out", conf, "--data", data,
           "--budget-ms", str(a.budget_ms), *(["--verify"] if a.verify else []), "--", *workload]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=7200)
    if p.returncode != 0:
        raise RuntimeError(f"tune {name} failed ({p.returncode}):\n{p.stdout[-4000:]}\n"
                           f"{p.stderr[-4000:]}")
    print(p.stdout, flush=True)
    out = {"conf": conf, "data": data, "seconds": time.monotonic() - t0}
    for kind, path in (("report", f"tuned-{name}-report.html"), ("plot", f"tuned-{name}-plot.png")):
        out[kind] = os.path.join(outdir, path)
        subprocess.run([sys.executable, "-m", "torch_fl", "report", "--from", data, "--out",
                        out[kind]], env=child_env(), check=True)
    return out


# ---- step 2: inference, one process, interleaved ----------------------------------------

def inference(a, tuned_conf: str) -> dict:
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch_fl
    import qwen3_workload as wl

    with open(tuned_conf, "rb") as f:
        entries, errors = torch_fl._C._parse_config(f.read(), tuned_conf)
    assert not errors, errors
    tuned = [(op, ", ".join(chain)) for op, chain, _ in entries]
    cfg = wl.SIZES[a.size]
    models = {"cuda": wl.build_model(a.size, torch.bfloat16, "cpu", seed=0).to("cuda"),
              "flagos": wl.build_model(a.size, torch.bfloat16, "flagos", seed=0)}
    for m in models.values():
        m.generation_config.pad_token_id = 0
    sides = ("cuda",) + SIDES

    def routes(side):
        for op, _ in tuned:
            torch_fl.routing.set_route(op, "")
        torch_fl.routing.set_route("*", "cuda" if side == "all-cuda" else "")
        if side == "tuned":
            for op, chain in tuned:
                torch_fl.routing.set_route(op, chain)

    def run(side, batch):
        routes(side)
        dev = "cuda" if side == "cuda" else "flagos"
        ids = wl.prompt_ids(cfg["vocab_size"], batch, a.prompt_len, seed=batch).to(dev)
        return q.timed_generate(models["cuda" if side == "cuda" else "flagos"], ids, a.new_tokens)

    results = {}
    for batch in a.batches:
        times, tokens = q.interleaved(list(sides), lambda side: run(side, batch), a.warmup,
                                      a.rounds)
        row = {}
        for side in sides:
            row[side] = {"tok_s": statistics.median(batch * a.new_tokens / t for t in times[side]),
                         "times": times[side],
                         "tokens_equal_cuda": int((tokens[side] == tokens["cuda"]).sum()),
                         "tokens": tokens[side].numel()}
        results[f"batch {batch}"] = row
    routes("default")
    return results


# ---- step 2: training, a process per configuration and round ------------------------------

def run_train(a, side: str, tuned_conf: str) -> dict:
    child = {"cuda": "cuda", "all-cuda": "flagos all-cuda"}.get(side, "flagos")
    extra = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"} if side == "cuda" else {}
    if side == "tuned":
        extra["FLAGOS_BACKEND_CONFIG"] = tuned_conf
    cmd = [sys.executable, QWEN3, "--train-child", child, "--size", a.size, "--steps", str(a.steps),
           "--train-batch", str(a.train_batch), "--train-len", str(a.train_len)]
    p = subprocess.run(cmd, env=child_env(extra), capture_output=True, text=True, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("@@qwen3 "):
            return json.loads(line[len("@@qwen3 "):])
    raise RuntimeError(f"training {side}: exited {p.returncode}\n{p.stderr[-3000:]}")


def training(a, tuned_conf: str) -> dict:
    sides = ("cuda",) + SIDES
    runs = {s: [] for s in sides}
    for r in range(a.train_rounds):
        order = sides if r % 2 == 0 else tuple(reversed(sides))
        for s in order:
            runs[s].append(run_train(a, s, tuned_conf))
    modes = [k for k in runs["cuda"][0] if k != "config"]
    return {mode: {s: {"step_ms": statistics.median(x[mode]["step_s"] for x in runs[s]) * 1e3,
                       "times": [x[mode]["step_s"] for x in runs[s]],
                       "losses_equal_cuda": runs[s][0][mode]["losses"] == runs["cuda"][0][mode]["losses"]}
                   for s in sides} for mode in modes}


def ratios(row: dict) -> dict:
    """Medians of per-round time ratios (for tokens/s, the inverse ratios)."""
    def per_round(x, y):
        return [tx / ty for tx, ty in zip(row[x]["times"], row[y]["times"])]

    med = statistics.median
    out = {"tuned / default": med(per_round("tuned", "default")),
           "tuned / all-cuda": med(per_round("tuned", "all-cuda")),
           "A/A": med(per_round("default (A/A)", "default")),
           "tuned / cuda": med(per_round("tuned", "cuda"))}
    # Per round, against the faster of default and all-cuda.
    out["tuned / faster other"] = med(max(d, c) for d, c in zip(per_round("tuned", "default"),
                                                                 per_round("tuned", "all-cuda")))
    out["meets_bar"] = out["tuned / faster other"] <= 1 + abs(out["A/A"] - 1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    q.add_workload_args(p)
    p.add_argument("--budget-ms", type=float, default=5.0, help="tune's timing budget")
    p.add_argument("--tune-new-tokens", type=int, default=16,
                   help="new tokens per generate() while tuning (a sample of the decode shapes)")
    p.add_argument("--verify", action="store_true", help="tune with --verify")
    p.add_argument("--tuned-infer", help="use this config for inference instead of tuning")
    p.add_argument("--tuned-train", help="use this config for training instead of tuning")
    p.add_argument("--outdir", default=None,
                   help="where the tuned configs, data, reports and plots go (default: a new "
                        "directory under /tmp)")
    p.add_argument("--infer-child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.infer_child:
        return infer_child(a)

    meta = q.run_meta(a)
    if meta is None:
        return 0
    t0 = time.monotonic()
    outdir = os.path.abspath(a.outdir or f"/tmp/tuned-qwen3-{os.getpid()}")
    os.makedirs(outdir, exist_ok=True)
    res = {"meta": {**meta, "outdir": outdir}, "tune": {}}
    shape = ["--size", a.size]
    if "inference" not in a.skip:
        conf = a.tuned_infer
        if conf is None:
            res["tune"]["inference"] = tune(a, outdir, "infer", [
                sys.executable, os.path.abspath(__file__), "--infer-child", *shape, "--batches",
                *map(str, a.batches), "--prompt-len", str(a.prompt_len), "--new-tokens",
                str(a.tune_new_tokens)])
            conf = res["tune"]["inference"]["conf"]
        res["inference"] = inference(a, os.path.abspath(conf))
        res["inference_config"] = open(conf).read()
    if "training" not in a.skip:
        conf = a.tuned_train
        if conf is None:
            res["tune"]["training"] = tune(a, outdir, "train", [
                sys.executable, QWEN3, "--train-child", "flagos", *shape, "--steps", "3",
                "--train-batch", str(a.train_batch), "--train-len", str(a.train_len)])
            conf = res["tune"]["training"]["conf"]
        res["training"] = training(a, os.path.abspath(conf))
        res["training_config"] = open(conf).read()

    print(f"\nQwen3 {a.size} (random weights), {meta['gpu']}, torch {meta['torch']}, "
          f"{time.monotonic() - t0:.0f} s; tuned configs, data, reports, plots: {outdir}")
    for key, row in res.get("inference", {}).items():
        _report(row, f"HF generate(), {key}, prompt {a.prompt_len}, {a.new_tokens} new tokens, "
                f"bf16, {a.rounds} rounds", lambda r: f"{r['tok_s']:>9.1f} tok/s  tokens equal cuda "
                f"{r['tokens_equal_cuda']}/{r['tokens']}")
    for mode, row in res.get("training", {}).items():
        _report(row, f"training step, {mode} AdamW, B={a.train_batch} L={a.train_len}, "
                f"{a.train_rounds} rounds", lambda r: f"{r['step_ms']:>9.1f} ms  losses equal cuda: "
                f"{r['losses_equal_cuda']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def _report(row: dict, title: str, line) -> None:
    """Prints one table (a side per line) and its time ratios; stores them in `row`."""
    rt = row["ratios"] = ratios(row)
    print(title)
    for side in ("cuda",) + SIDES:
        print(f"  {side:<14} {line(row[side])}")
    _print_ratios(rt)


def _print_ratios(rt: dict) -> None:
    print("  time ratios (median of rounds; < 1: tuned is faster): " + ", ".join(
        f"{k} {v:.3f}" for k, v in rt.items() if isinstance(v, float)))
    print("  " + ("tuned is at least as fast as the faster of default and all-cuda (within A/A)"
                  if rt["meets_bar"] else "tuned is SLOWER than the faster of default and all-cuda"))


if __name__ == "__main__":
    sys.exit(main())
