"""Qwen3 (0.6B-shaped, random weights) on flagos against native CUDA: HF generate()
tokens/s at batch 1 and 8, and training-step time (fp32 AdamW, bf16 autocast).

Configurations:
- ``cuda``: native CUDA tensors;
- ``flagos all-cuda``: flagos with ``* = cuda`` (PyTorch's CUDA kernels through
  flagos' routing path);
- ``flagos``: flagos with the default routing (FlagGems where it serves an
  operator, CUDA's kernels for the rest; its kernels launched from C++ where
  described, docs/flaggems_cpp.md);
- optional (--configs): ``flagos python``, the default routing with every
  FlagGems kernel through its Python wrapper (the C++ launch path off).

Method (docs/benchmarks.md):
- Inference runs in one process: CUDA's forward is untouched by torch_fl (no
  operator on a cuda tensor reaches flagos), so the three configurations and
  an A/A pair (``cuda`` twice) are interleaved in R rounds, rotating which goes
  first; a round times one ``model.generate()`` (greedy, KV cache, prompt P,
  N new tokens, default attention) per configuration and batch size; the
  ratio reported is the median of the per-round ratios against ``cuda``, with
  the generated tokens compared to CUDA's.
- Training runs one process per configuration and round (a CUDA backward
  cannot run in a process that loaded torch_fl: pytorch#161129, docs/gpu.md),
  alternating the order of configurations between rounds, with a second CUDA
  process per round as the A/A row; a process runs S fp32 AdamW steps and S
  bf16-autocast AdamW steps from the same seeded model; a step's time is the
  median of steps 2..S; the ratio is the median of the per-round ratios;
  losses are compared to CUDA's bit for bit.
- The forward half of a training step (the loss, autograd recording the
  graph; fp32 and bf16 autocast) shares one process: CUDA, its A/A twin and
  the flagos configurations interleaved over --forward-rounds rounds, the
  first side rotating; the ratio is the median of per-round time ratios,
  losses compared bit for bit. Both sides run in the same process state, round
  by round; a whole step's separate processes add their own differences.
- Every timed region runs with Python's garbage collector off, after a
  collection (as timeit does), so no side pays for another's garbage.
- The flagos configurations' training steps are also compared with each
  other in one process (they can share one): a model and optimizer per
  configuration, steps interleaved with the first side rotating, the ratio
  the median of per-step ratios against ``flagos all-cuda``. Separate
  processes vary more between themselves than the sides differ.

    PYTHONPATH=. python bench/qwen3.py [--rounds 5] [--train-rounds 2] [--json out.json]
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
CONFIGS = ("cuda", "flagos all-cuda", "flagos", "flagos python")
DEFAULT_CONFIGS = ("flagos all-cuda", "flagos")
TRAIN_MODES = ("fp32", "bf16 autocast")
# CUDA against itself: the noise the flagos rows are read against.
BASELINES = ("cuda", "cuda (A/A)")
# A flagos configuration: the '*' route it installs ("" removes the override)
# and whether FlagGems' C++ launch path is on.
ROUTINGS = {"flagos all-cuda": ("cuda", True), "flagos": ("", True), "flagos python": ("", False)}


def use_routing(config: str) -> None:
    """Installs flagos configuration `config` (ROUTINGS) in this process."""
    import torch_fl

    route, cpp = ROUTINGS[config]
    torch_fl.routing.set_route("*", route)
    torch_fl.flaggems.set_cpp_enabled(cpp)


@contextlib.contextmanager
def no_gc():
    """Python's garbage collector collected before, and off during, a timed
    region (as timeit does): a collection of generate()'s or a training step's
    garbage would otherwise fall on whichever side happens to trigger it."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


# ---- inference: one process, interleaved ------------------------------------------------

def timed_generate(model, ids, new_tokens):
    """The workload's generate(): greedy, KV cache, exactly new_tokens tokens.
    Returns the new tokens (CPU) and the seconds it took, device synchronized."""
    import torch
    import qwen3_workload as wl

    with torch.no_grad(), no_gc():
        wl.synchronize(ids.device)
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, use_cache=True, pad_token_id=0)
        wl.synchronize(ids.device)
        return out[:, ids.shape[1]:].cpu(), time.perf_counter() - t0


def interleaved(sides: list, run, warmup: int, rounds: int) -> tuple:
    """warmup untimed calls of run(side) per side, then rounds rounds of one
    timed call per side, the first side rotating; run returns (output, seconds)
    (tokens, a loss). Returns the seconds per side and round, and each side's
    last output."""
    for side in sides:  # warm-up: compilation, autotuning, caches
        for _ in range(warmup):
            run(side)
    times = {s: [] for s in sides}
    outputs = {}
    for r in range(rounds):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:
            outputs[side], t = run(side)
            times[side].append(t)
    return times, outputs


def inference(a) -> dict:
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch_fl
    import qwen3_workload as wl

    cfg = wl.SIZES[a.size]
    base = wl.build_model(a.size, torch.bfloat16, "cpu", seed=0)
    models = {"cuda": base.to("cuda")}
    models["flagos"] = wl.build_model(a.size, torch.bfloat16, "flagos", seed=0)
    for m in models.values():
        m.generation_config.pad_token_id = 0
    sides = [*BASELINES, *(c for c in ROUTINGS if c in a.configs)]
    torch_fl.routing.reset_stats()

    def run(side, batch):
        dev = "cuda" if side in BASELINES else "flagos"
        if dev == "flagos":
            use_routing(side)
        ids = wl.prompt_ids(cfg["vocab_size"], batch, a.prompt_len, seed=batch).to(dev)
        return timed_generate(models[dev], ids, a.new_tokens)

    results = {}
    for batch in a.batches:
        times, tokens = interleaved(sides, lambda side: run(side, batch), a.warmup, a.rounds)
        row = {}
        for side in sides:
            tok_s = [batch * a.new_tokens / t for t in times[side]]
            ratios = [tc / ts for ts, tc in zip(times[side], times["cuda"])]
            row[side] = {"tok_s": statistics.median(tok_s),
                         "ratio": statistics.median(ratios), "per_round": ratios,
                         "tokens_equal_cuda": int((tokens[side] == tokens["cuda"]).sum()),
                         "tokens": tokens[side].numel()}
        results[f"batch {batch}"] = row
    use_routing("flagos")
    # Which backend served the flagos runs: one more of them, counted.
    torch_fl.routing.reset_stats()
    run("flagos" if "flagos" in sides else "flagos all-cuda", a.batches[0])
    summary = wl.routing_summary()
    results["routing"] = {b: list(v) for b, v in wl.calls_by_backend(summary).items()}
    # FlagGems through its Python wrapper (first calls of a kernel key, keys or
    # operators the C++ path does not serve): what is left to port.
    results["flaggems_python_ops"] = {s["op"].removeprefix("aten::"): s["calls"]["flaggems-python"]
                                      for s in summary["stats"] if s["calls"].get("flaggems-python")}
    if summary.get("flaggems_cpp"):
        s = summary["flaggems_cpp"]
        results["flaggems_cpp"] = {k: s[k] for k in ("launched", "captures", "admitted", "pinned")}
    return results


# ---- training: a process per configuration and round ------------------------------------

def train_step(model, opt, x, device, amp: bool):
    """One AdamW step on token batch x (labels = inputs), bf16 autocast when amp;
    returns the loss tensor."""
    import torch

    opt.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        loss = model(input_ids=x, labels=x, use_cache=False).loss
    loss.backward()
    opt.step()
    return loss


def train_child(a) -> int:
    sys.path.insert(0, EXAMPLES)
    import torch
    import qwen3_workload as wl

    device = "cuda" if a.config == "cuda" else "flagos"
    if device == "flagos":
        use_routing(a.config)
    cfg = wl.SIZES[a.size]
    batches = wl.train_batches(cfg["vocab_size"], a.train_batch, a.train_len, seed=0)
    out = {"config": a.config}
    for mode in TRAIN_MODES:
        model = wl.build_model(a.size, torch.float32, device, seed=0, train=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
        data = batches.to(device)
        losses, times = [], []
        for step in range(a.steps):
            x = data[step % data.shape[0]]
            with no_gc():
                wl.synchronize(device)
                t0 = time.perf_counter()
                loss = train_step(model, opt, x, device, amp=(mode != "fp32"))
                wl.synchronize(device)
                times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        out[mode] = {"step_s": statistics.median(times[1:]), "losses": losses}
        del model, opt
    print("@@qwen3 " + json.dumps(out), flush=True)
    return 0


def run_train(a, config: str) -> dict:
    env = dict(os.environ)
    if config == "cuda":
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--train-child", config, "--size", a.size,
           "--steps", str(a.steps), "--train-batch", str(a.train_batch),
           "--train-len", str(a.train_len)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("@@qwen3 "):
            return json.loads(line[len("@@qwen3 "):])
    raise RuntimeError(f"{config}: exited {p.returncode}\n{p.stderr[-3000:]}")


def training(a) -> dict:
    # The A/A side is a second CUDA process per round.
    configs = (*BASELINES, *(c for c in ROUTINGS if c in a.configs))
    runs = {c: [] for c in configs}
    for r in range(a.train_rounds):
        order = configs if r % 2 == 0 else tuple(reversed(configs))
        for c in order:
            runs[c].append(run_train(a, "cuda" if c in BASELINES else c))
            # Progress as it comes: a run cut short by a time limit still leaves its rounds.
            print(f"  training round {r + 1}/{a.train_rounds}, {c}: " + ", ".join(
                f"{m} {runs[c][-1][m]['step_s'] * 1e3:.1f} ms" for m in TRAIN_MODES), flush=True)
    out = {}
    for mode in TRAIN_MODES:
        row = {}
        for c in configs:
            steps = [x[mode]["step_s"] for x in runs[c]]
            ratios = [x[mode]["step_s"] / y[mode]["step_s"] for x, y in zip(runs[c], runs["cuda"])]
            row[c] = {"step_ms": statistics.median(steps) * 1e3,
                      "ratio": statistics.median(ratios), "per_round": ratios,
                      "losses_equal_cuda": runs[c][0][mode]["losses"] == runs["cuda"][0][mode]["losses"],
                      "losses": runs[c][0][mode]["losses"]}
        out[mode] = row
    return out


# ---- training forward: one process, interleaved -------------------------------------------

def training_forward(a) -> dict:
    """The forward half of a training step (loss with autograd recording the
    graph, fp32 and bf16 autocast), native CUDA and the flagos configurations
    interleaved in one process, with an A/A pair (``cuda`` twice). A whole step
    needs a process per side (a CUDA backward beside flagos fails,
    pytorch#161129), and processes differ by more than the sides do; the
    forward shares one, so its ratio is the step's most precise share. The
    graph is dropped unused; the ratio is the median of a.forward_rounds
    per-round ratios, after a.warmup forwards per side; losses are compared
    to CUDA's bit for bit."""
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch_fl  # noqa: F401  (the flagos device, before the data moves there)
    import qwen3_workload as wl

    cfg = wl.SIZES[a.size]
    x = wl.train_batches(cfg["vocab_size"], a.train_batch, a.train_len, seed=0)[0]
    xs = {"cuda": x.to("cuda"), "flagos": x.to("flagos")}
    sides = [*BASELINES, *(c for c in ROUTINGS if c in a.configs)]
    models = {d: wl.build_model(a.size, torch.float32, d, seed=0, train=True) for d in xs}
    out = {}
    try:
        for mode in TRAIN_MODES:
            def run(side):
                dev = "cuda" if side in BASELINES else "flagos"
                if dev == "flagos":
                    use_routing(side)
                with no_gc():
                    wl.synchronize(dev)
                    t0 = time.perf_counter()
                    with torch.autocast(dev, dtype=torch.bfloat16, enabled=(mode != "fp32")):
                        loss = models[dev](input_ids=xs[dev], labels=xs[dev], use_cache=False).loss
                    wl.synchronize(dev)
                    return loss.item(), time.perf_counter() - t0

            times, losses = interleaved(sides, run, a.warmup, a.forward_rounds)
            row = {}
            for side in sides:
                ratios = [ts / tc for ts, tc in zip(times[side], times["cuda"])]
                row[side] = {"forward_ms": statistics.median(times[side]) * 1e3,
                             "ratio": statistics.median(ratios), "per_round": ratios,
                             "loss_equal_cuda": losses[side] == losses["cuda"]}
            out[mode] = row
    finally:
        use_routing("flagos")
    return out


# ---- training: flagos routings against each other, one process, interleaved ------------

def training_routings(a) -> dict:
    """The flagos configurations' training steps against each other (default
    routing against all-cuda): they can share a process, so their steps are
    interleaved, each side's model and optimizer seeded alike, the first side
    rotating per step; the ratio is the median of per-step ratios against
    ``flagos all-cuda``."""
    sys.path.insert(0, EXAMPLES)
    import torch
    import torch_fl  # noqa: F401  (the flagos device, before the data moves there)
    import qwen3_workload as wl

    sides = [c for c in ROUTINGS if c in a.configs]
    if "flagos all-cuda" not in sides or len(sides) < 2:
        return {}
    cfg = wl.SIZES[a.size]
    data = wl.train_batches(cfg["vocab_size"], a.train_batch, a.train_len, seed=0).to("flagos")

    out = {}
    try:
        for mode in TRAIN_MODES:
            state = {}
            for side in sides:
                use_routing(side)
                model = wl.build_model(a.size, torch.float32, "flagos", seed=0, train=True)
                state[side] = (model, torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True))
            times = {side: [] for side in sides}
            for step in range(a.routing_steps + 2):  # two warm-up steps each
                x = data[step % data.shape[0]]
                for side in sides[step % len(sides):] + sides[:step % len(sides)]:
                    use_routing(side)
                    with no_gc():
                        wl.synchronize("flagos")
                        t0 = time.perf_counter()
                        train_step(*state[side], x, "flagos", amp=(mode != "fp32"))
                        wl.synchronize("flagos")
                    if step >= 2:
                        times[side].append(time.perf_counter() - t0)
            row = {}
            for side in sides:
                ratios = [t / b for t, b in zip(times[side], times["flagos all-cuda"])]
                row[side] = {"step_ms": statistics.median(times[side]) * 1e3,
                             "ratio": statistics.median(ratios),
                             "ratio_range": [min(ratios), max(ratios)]}
            out[mode] = row
            del state
    finally:
        use_routing("flagos")
    return out


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The workload's and the method's arguments (bench/tuned_qwen3.py takes them too)."""
    p.add_argument("--size", default="0.6b")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--train-batch", type=int, default=4)
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--train-rounds", type=int, default=2)
    p.add_argument("--routing-steps", type=int, default=30,
                   help="interleaved steps per side of the in-process routing comparison")
    p.add_argument("--forward-rounds", type=int, default=12,
                   help="interleaved rounds of the one-process training-forward comparison")
    p.add_argument("--skip", choices=("inference", "training", "forward", "routings"),
                   action="append",
                   default=[])
    p.add_argument("--json")


def run_meta(a) -> dict | None:
    """The run's record (date, arguments, GPU, torch), or None, said, without a GPU."""
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        return None
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "args": vars(a),
            "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_args(p)
    p.add_argument("--configs", nargs="+", choices=CONFIGS[1:], default=list(DEFAULT_CONFIGS),
                   help="flagos configurations to compare with cuda (default: %(default)s)")
    p.add_argument("--train-child", choices=CONFIGS, dest="config", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.config:
        return train_child(a)

    meta = run_meta(a)
    if meta is None:
        return 0
    t0 = time.monotonic()
    res = {"meta": meta}
    print(f"Qwen3 {a.size} (random weights), {meta['gpu']}, torch {meta['torch']}", flush=True)

    def save():  # after each part, so a run cut short keeps what it measured
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)

    if "inference" not in a.skip:
        res["inference"] = inference(a)
        save()
        for key, row in res["inference"].items():
            if not key.startswith("batch"):
                continue
            print(f"HF generate(), {key}, prompt {a.prompt_len}, {a.new_tokens} new tokens, bf16, "
                  f"{a.rounds} rounds (x cuda: tokens/s ratio, higher is better)")
            for side, r in row.items():
                print(f"  {side:<16} {r['tok_s']:>9.1f} tok/s  x cuda {r['ratio']:5.3f}  tokens equal "
                      f"{r['tokens_equal_cuda']}/{r['tokens']}  per round "
                      + " ".join(f"{x:.3f}" for x in r["per_round"]))
        print("flagos routing: " + ", ".join(
            f"{b} {o} ops/{n} calls" for b, (o, n) in sorted(res["inference"]["routing"].items())))
        if res["inference"].get("flaggems_python_ops"):
            print(f"FlagGems through Python (calls): {res['inference']['flaggems_python_ops']}")
        print(f"({time.monotonic() - t0:.0f} s)", flush=True)
    # The parts reported as time ratios against cuda: (--skip name, result key,
    # part, time key, bit-equality key, title of one mode's table).
    time_parts = (
        ("training", "training", training, "step_ms", "losses_equal_cuda",
         lambda mode: f"training step, {mode} AdamW, B={a.train_batch} L={a.train_len}, "
                      f"{a.train_rounds} rounds"),
        ("forward", "training_forward", training_forward, "forward_ms", "loss_equal_cuda",
         lambda mode: f"training forward (loss, autograd recording), {mode}, B={a.train_batch} "
                      f"L={a.train_len}, one process, {a.forward_rounds} rounds"),
    )
    for skip, key, part, ms_key, equal_key, title in time_parts:
        if skip in a.skip:
            continue
        res[key] = part(a)
        save()
        label = equal_key.removesuffix("_cuda").replace("_", " ")  # "losses equal"
        for mode, row in res[key].items():
            print(f"{title(mode)} (x cuda: time ratio, lower is better)")
            for c, r in row.items():
                print(f"  {c:<16} {r[ms_key]:>9.1f} ms  x cuda {r['ratio']:5.3f}  {label}: "
                      f"{r[equal_key]}  per round " + " ".join(f"{x:.3f}" for x in r["per_round"]))
        print(f"({time.monotonic() - t0:.0f} s)", flush=True)
    if "routings" not in a.skip:
        res["training_routings"] = training_routings(a)
        save()
        for mode, row in res["training_routings"].items():
            print(f"training step, {mode} AdamW, B={a.train_batch} L={a.train_len}, flagos routings "
                  f"interleaved in one process, {a.routing_steps} steps each (x all-cuda: step time "
                  "ratio, lower is better)")
            for c, r in row.items():
                lo, hi = r["ratio_range"]
                print(f"  {c:<16} {r['step_ms']:>9.1f} ms  x all-cuda {r['ratio']:5.3f}  "
                      f"steps {lo:.3f}-{hi:.3f}")
        print(f"({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
