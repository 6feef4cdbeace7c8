"""Qwen3 (0.6B-shaped, random weights) on flagos against native CUDA: prefill and decode
tokens/s, and training-step time.

Three configurations, each in its own process (a native-CUDA backward cannot
run in a process that loaded torch_fl, pytorch#161129), in one run of this
script:

- ``flagos``: flagos with the default routing (FlagGems where it serves an
  operator, CUDA's kernels for the rest);
- ``flagos all-cuda``: flagos with ``* = cuda`` (every operator on PyTorch's
  CUDA kernels, through the routing path);
- ``cuda``: native CUDA, TORCH_DEVICE_BACKEND_AUTOLOAD=0 (torch_fl never loaded);
- optional (--configs): ``flagos python`` (default routing, FlagGems' kernels
  through its Python wrappers only: FLAGOS_FLAGGEMS_CPP=0) and ``flagos
  stub-only`` (FLAGOS_DISABLE_FLAGGEMS_PY=1: only the C++-launched ones).

Each process builds the model (examples/qwen3_workload.py), then:
inference in bfloat16, batch B, prompt P, N new tokens, greedy, KV cache:
W untimed warm-up generations, then R timed ones; prefill tokens/s and
decode tokens/s are the medians. Training in float32: S AdamW steps on
batch B x P; the step time is the median of steps 2..S (step 1 holds
compilation and allocation). Ratios are against native CUDA (>1: faster for
tokens/s columns, slower for the step-time column as labelled). The
configurations run in the order given by --order, ``rounds`` times, and the
medians over rounds are reported.

    PYTHONPATH=. python bench/qwen3.py [--size 0.6b] [--rounds 1] [--json out.json]
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
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
CONFIGS = ("cuda", "flagos all-cuda", "flagos")
ALL_CONFIGS = CONFIGS + ("flagos python", "flagos stub-only")


def child(a) -> int:
    sys.path.insert(0, EXAMPLES)
    import torch
    import qwen3_workload as wl

    device = "cuda" if a.config == "cuda" else "flagos"
    if device == "flagos":
        import torch_fl  # noqa: F401
    cfg = wl.SIZES[a.size]
    out = {"config": a.config}
    model = wl.build_model(a.size, torch.bfloat16, device, seed=0)
    prompt = wl.prompt_ids(cfg["vocab_size"], a.batch, a.prompt_len, seed=0)
    pre, dec = [], []
    for r in range(a.warmup + a.repeats):
        res = wl.generate(model, prompt, a.new_tokens, device, warmup=0, all_logits=False)
        if r >= a.warmup:
            pre.append(res["timing"]["prefill_tok_s"])
            dec.append(res["timing"]["decode_tok_s"])
    out["prefill_tok_s"] = statistics.median(pre)
    out["decode_tok_s"] = statistics.median(dec)
    out["tokens"] = res["tokens"].tolist()
    del model
    model = wl.build_model(a.size, torch.float32, device, seed=0, train=True)
    batches = wl.train_batches(cfg["vocab_size"], a.batch, a.prompt_len, seed=0)
    tr = wl.train(model, batches, a.steps, device, lr=1e-4)
    out["train_step_s"] = statistics.median(tr["step_times_s"][1:])
    out["final_loss"] = tr["losses"][-1]
    if device == "flagos":
        summary = wl.routing_summary()
        out["routing"] = {b: list(v) for b, v in wl.calls_by_backend(summary).items()}
        # Operators FlagGems served through its Python wrapper (first calls, keys the
        # C++ path does not describe or declines): what is left to port.
        out["flaggems_python_ops"] = {s["op"].removeprefix("aten::"): s["calls"]["flaggems-python"]
                                      for s in summary["stats"] if s["calls"].get("flaggems-python")}
        if summary.get("flaggems_cpp"):
            s = summary["flaggems_cpp"]
            out["flaggems_cpp"] = {k: s[k] for k in ("launched", "captures", "admitted", "pinned")}
    print("@@qwen3 " + json.dumps(out), flush=True)
    return 0


def run_config(a, config: str, conf_path: str) -> dict:
    env = dict(os.environ)
    env.pop("FLAGOS_BACKEND_CONFIG", None)
    for k in ("FLAGOS_FLAGGEMS_CPP", "FLAGOS_DISABLE_FLAGGEMS_PY"):
        env.pop(k, None)
    if config == "cuda":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    elif config == "flagos all-cuda":
        env["FLAGOS_BACKEND_CONFIG"] = conf_path
    elif config == "flagos python":
        env["FLAGOS_FLAGGEMS_CPP"] = "0"
    elif config == "flagos stub-only":
        env["FLAGOS_DISABLE_FLAGGEMS_PY"] = "1"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", config, "--size", a.size,
           "--batch", str(a.batch), "--prompt-len", str(a.prompt_len),
           "--new-tokens", str(a.new_tokens), "--warmup", str(a.warmup),
           "--repeats", str(a.repeats), "--steps", str(a.steps)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("@@qwen3 "):
            return json.loads(line[len("@@qwen3 "):])
    raise RuntimeError(f"{config}: exited {p.returncode}\n{p.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="0.6b")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, from {', '.join(ALL_CONFIGS)} (cuda is always run)")
    p.add_argument("--child", choices=ALL_CONFIGS, dest="config", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.config:
        return child(a)
    configs = tuple(c.strip() for c in a.configs.split(",") if c.strip())
    bad = [c for c in configs if c not in ALL_CONFIGS]
    if bad:
        p.error(f"unknown configs {bad}: choose from {', '.join(ALL_CONFIGS)}")
    configs = ("cuda",) + tuple(c for c in configs if c != "cuda")

    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        return 0
    t_start = time.monotonic()
    with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
        f.write("* = cuda\n")
        conf = f.name
    runs = {c: [] for c in configs}
    try:
        for r in range(a.rounds):
            order = configs if r % 2 == 0 else tuple(reversed(configs))
            for c in order:
                runs[c].append(run_config(a, c, conf))
                x = runs[c][-1]
                print(f"{c}: prefill {x['prefill_tok_s']:.0f} tok/s, decode {x['decode_tok_s']:.1f} "
                      f"tok/s, train step {x['train_step_s'] * 1e3:.1f} ms", flush=True)
    finally:
        os.unlink(conf)
    med = statistics.median
    rows = {}
    for c in configs:
        rows[c] = {k: med(x[k] for x in runs[c])
                   for k in ("prefill_tok_s", "decode_tok_s", "train_step_s")}
        rows[c]["routing"] = runs[c][-1].get("routing")
        rows[c]["flaggems_cpp"] = runs[c][-1].get("flaggems_cpp")
        rows[c]["flaggems_python_ops"] = runs[c][-1].get("flaggems_python_ops")
        rows[c]["tokens_equal_cuda"] = runs[c][-1]["tokens"] == runs["cuda"][-1]["tokens"]
    base = rows["cuda"]
    print(f"Qwen3 {a.size} (random weights), {torch.cuda.get_device_name(0)}, torch "
          f"{torch.__version__}; inference bf16 B={a.batch} P={a.prompt_len} N={a.new_tokens}, "
          f"training fp32 AdamW B={a.batch} L={a.prompt_len}; {a.rounds} round(s), "
          f"{time.monotonic() - t_start:.0f} s")
    print(f"{'config':<17} {'prefill tok/s':>14} {'x cuda':>7} {'decode tok/s':>13} {'x cuda':>7} "
          f"{'train step ms':>14} {'x cuda':>7}")
    for c in configs:
        r = rows[c]
        r["prefill_vs_cuda"] = r["prefill_tok_s"] / base["prefill_tok_s"]
        r["decode_vs_cuda"] = r["decode_tok_s"] / base["decode_tok_s"]
        r["train_step_vs_cuda"] = r["train_step_s"] / base["train_step_s"]
        print(f"{c:<17} {r['prefill_tok_s']:>14.0f} {r['prefill_vs_cuda']:>7.2f} "
              f"{r['decode_tok_s']:>13.1f} {r['decode_vs_cuda']:>7.2f} "
              f"{r['train_step_s'] * 1e3:>14.1f} {r['train_step_vs_cuda']:>7.2f}")
    print("x cuda: tokens/s as a fraction of native CUDA's (higher is better); step time as a "
          "multiple of native CUDA's (lower is better)")
    for c in configs:
        if rows[c]["routing"]:
            print(f"{c} routing: " + ", ".join(f"{b} {o} ops/{n} calls"
                                             for b, (o, n) in sorted(rows[c]["routing"].items())))
        if rows[c].get("flaggems_cpp"):
            s = rows[c]["flaggems_cpp"]
            print(f"{c} FlagGems from C++: launched {s['launched']}, captures {s['captures']}, "
                  f"admitted {s['admitted']}, pinned {len(s['pinned'])} {s['pinned'][:3]}")
        if rows[c].get("flaggems_python_ops"):
            print(f"{c} FlagGems through Python: {rows[c]['flaggems_python_ops']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                                "args": vars(a), "gpu": torch.cuda.get_device_name(0),
                                "torch": torch.__version__},
                       "rows": rows, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
