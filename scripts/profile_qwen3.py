"""Where a Qwen3 workload's time goes on one configuration: wall time per step,
the device's kernel time, and the kernels, copies and top-level operators of
one profiled step (torch.profiler, CPU and CUDA activities). Two JSON files,
compared, show what flagos adds over native CUDA:

    python scripts/profile_qwen3.py --config cuda --what train-fp32 --json cuda.json
    python scripts/profile_qwen3.py --config "flagos all-cuda" --what train-fp32 --json fl.json
    python scripts/profile_qwen3.py --compare cuda.json fl.json

Each configuration runs in its own process (as bench/qwen3.py's training does).
Separate processes differ by more than the configurations do, so for generate
`--interleave` profiles CUDA and all-cuda in one process, alternating rounds,
and writes both files (`--json` gets a `.cuda` and a `.all-cuda` suffix):

    python scripts/profile_qwen3.py --what generate --batch 8 --interleave --json g8
    python scripts/profile_qwen3.py --compare g8.cuda g8.all-cuda
"""

import argparse
import collections
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))

CONFIGS = ("cuda", "flagos all-cuda", "flagos")
WHATS = ("train-fp32", "train-bf16", "generate")


def workload(a):
    """Returns (device, one-step callable) for the configuration: the step
    bench/qwen3.py times."""
    import torch
    import qwen3_workload as wl
    from qwen3 import train_step

    device = "cuda" if a.config == "cuda" else "flagos"
    if device == "flagos":
        import torch_fl

        torch_fl.routing.set_route("*", "cuda" if a.config == "flagos all-cuda" else "")
    cfg = wl.SIZES[a.size]
    if a.what == "generate":
        return device, generate_step(a, device)
    model = wl.build_model(a.size, torch.float32, device, seed=0, train=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = wl.train_batches(cfg["vocab_size"], a.batch, 128, seed=0).to(device)[0]
    return device, lambda: train_step(model, opt, x, device, amp=a.what == "train-bf16")


def generate_step(a, device):
    """bench/qwen3.py's generate() on `device`: a callable returning (tokens,
    seconds)."""
    import torch
    import qwen3_workload as wl
    from qwen3 import timed_generate

    model = wl.build_model(a.size, torch.bfloat16, device, seed=0)
    model.generation_config.pad_token_id = 0
    ids = wl.prompt_ids(wl.SIZES[a.size]["vocab_size"], a.batch, 32, seed=a.batch).to(device)
    return lambda: timed_generate(model, ids, a.new_tokens)


def busy_us(intervals):
    """Length of the union of [start, end) intervals (µs)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def profile(a) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    import qwen3_workload as wl

    device, step = workload(a)
    for _ in range(a.warmup):
        step()
    wl.synchronize(device)
    walls = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        wl.synchronize(device)
        walls.append(time.perf_counter() - t0)
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        wl.synchronize(device)
        prof_wall = time.perf_counter() - t0
    return summarize(a, a.config, prof.events(), walls, prof_wall)


def summarize(a, config, events, walls, prof_wall, into=None) -> dict:
    """The kernels, copies and operators of configuration `config`'s profiled
    events, added to `into` (a previous summary of it) when given."""
    from torch.autograd import DeviceType

    out = into or {"config": config, "what": a.what, "batch": a.batch, "size": a.size,
                   "walls_ms": [], "profiled_wall_ms": 0.0, "device_busy_ms": 0.0,
                   "kernel_ms": 0.0, "launches": 0, "kernels": {}, "top_ops": {}, "all_ops": {}}
    spans = []
    for e in events:
        # With a PrivateUse1 backend registered, Kineto reports every GPU
        # kernel and copy as that device's, CUDA's own included.
        if e.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1):
            k = out["kernels"].setdefault(e.name[:120], [0, 0.0])
            k[0] += 1
            k[1] += e.time_range.elapsed_us()
            out["launches"] += 1
            out["kernel_ms"] += e.time_range.elapsed_us() / 1e3
            spans.append((e.time_range.start, e.time_range.end))
            continue
        if e.name.startswith("aten::"):  # every operator, nested ones too: counts
            out["all_ops"].setdefault(e.name, [0, 0.0])[0] += 1
            out["all_ops"][e.name][1] += e.self_cpu_time_total
        if e.cpu_parent is None and e.name.startswith(("aten::", "autograd::engine", "Optimizer.")):
            # Top-level host work of either thread: forward operators, the
            # backward's nodes (autograd's worker thread), the optimizer step.
            o = out["top_ops"].setdefault(e.name, [0, 0.0])
            o[0] += 1
            o[1] += e.cpu_time_total
    out["walls_ms"] += [w * 1e3 for w in walls]
    out["wall_ms"] = statistics.median(out["walls_ms"])
    out["profiled_wall_ms"] += prof_wall * 1e3
    out["device_busy_ms"] += busy_us(spans) / 1e3
    return out


def profile_interleaved(a) -> dict:
    """generate() on CUDA and on flagos all-cuda in one process: per round, one
    timed call per side (the first side alternating), then one profiled call per
    side. Returns {config: summary}, each the sum over the rounds."""
    import torch
    from torch.profiler import ProfilerActivity
    import torch_fl

    torch_fl.routing.set_route("*", "cuda")
    steps = {"cuda": generate_step(a, "cuda"), "flagos all-cuda": generate_step(a, "flagos")}
    for step in steps.values():
        for _ in range(a.warmup):
            step()
    out = {}
    for r in range(a.steps):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        walls = {c: steps[c]()[1] for c in order}
        for c in order:
            with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                prof_wall = steps[c]()[1]
            out[c] = summarize(a, c, prof.events(), [walls[c]], prof_wall, out.get(c))
    return out


def compare(a_path, b_path, top):
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    print(f"{a['what']} batch {a['batch']}: {a['config']} | {b['config']}")
    for key in ("wall_ms", "profiled_wall_ms", "device_busy_ms", "kernel_ms", "launches"):
        print(f"  {key:18s} {a[key]:12.2f} {b[key]:12.2f}  x{b[key] / max(a[key], 1e-9):.3f}")
    for title, field in (("kernels (count, ms)", "kernels"),
                         ("top-level operators and backward nodes (count, cpu ms)", "top_ops"),
                         ("every operator, nested ones too (count, self cpu ms)", "all_ops")):
        print(f"  {title}: largest differences")
        names = set(a.get(field, {})) | set(b.get(field, {}))
        rows = []
        for n in names:
            ca, ta = a.get(field, {}).get(n, [0, 0.0])
            cb, tb = b.get(field, {}).get(n, [0, 0.0])
            rows.append((tb - ta, n, ca, cb, ta / 1e3, tb / 1e3))
        rows.sort(key=lambda r: -abs(r[0]))
        for d, n, ca, cb, ta, tb in rows[:top]:
            print(f"    {d / 1e3:+9.3f} ms  {ca:6d} {cb:6d}  {ta:9.3f} {tb:9.3f}  {n[:90]}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=CONFIGS, default="cuda")
    p.add_argument("--what", choices=WHATS, default="train-fp32")
    p.add_argument("--size", default="0.6b")
    p.add_argument("--batch", type=int, default=4, help="training batch (x128 tokens) or generate batch")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--compare", nargs=2, metavar=("A", "B"))
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--interleave", action="store_true",
                   help="generate: CUDA and flagos all-cuda in one process, --steps alternating rounds")
    a = p.parse_args()
    if a.compare:
        compare(*a.compare, a.top)
        return 0
    if a.interleave:
        if a.what != "generate":
            p.error("--interleave profiles generate only: a training step needs a process per "
                    "configuration (pytorch#161129)")
        for c, out in profile_interleaved(a).items():
            print(f"{c} generate b{a.batch}: wall {out['wall_ms']:.2f} ms (median of "
                  f"{len(out['walls_ms'])}), device busy {out['device_busy_ms']:.2f} ms, "
                  f"{out['launches']} launches")
            if a.json:
                with open(f"{a.json}.{c.removeprefix('flagos ')}", "w") as f:
                    json.dump(out, f)
        return 0
    out = profile(a)
    print(f"{a.config} {a.what} b{a.batch}: wall {out['wall_ms']:.2f} ms, device busy "
          f"{out['device_busy_ms']:.2f} ms, {out['launches']} launches")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
