"""Per-op host time of FlagGems on flagos against native CUDA and against FlagGems' own use_gems().

Three ways of running one op, timed in one process:

- flagos: flagos tensors, default routing, so the op runs FlagGems' Triton
  kernel through torch_fl's flaggems provider (boxed routing path, zero-copy
  CUDA views, the Python kernel);
- cuda: plain CUDA tensors, PyTorch's CUDA kernels (the baseline);
- use_gems: plain CUDA tensors inside ``flag_gems.use_gems()``, FlagGems'
  own way of replacing CUDA kernels (its torch.library registration on the
  CUDA key).

Cases and the timing method are bench/cuda_overhead.py's (docs/benchmarks.md):
host time = (N back-to-back calls + one synchronize) / N; R rounds, each
timing every case on the three sides in a rotating order (use_gems() entered
once per side and round); ratios are medians of the per-round ratios. The
"served by" column lists the operators a flagos call ran on FlagGems (an empty
list: FlagGems does not serve it, so flagos runs CUDA's kernel). A result
check compares each side's output with CUDA's (bf16 tolerance for the bf16 mm).

    PYTHONPATH=. python bench/flaggems_ops.py [--rounds 7] [--scale 1] [--json out.json]

Prints "skipped: ..." and exits 0 without a GPU, the cuda driver or FlagGems.
"""

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_overhead  # noqa: E402
from cuda_overhead import timed_block  # noqa: E402

SIDES = ("flagos", "cuda", "use_gems")


def make_cases(device):
    """name -> (fn, calls per timed block at --scale 1): cuda_overhead's single
    ops (the same data), with a tenth of its calls (a FlagGems call costs about
    ten CUDA ones), plus silu and a row sum."""
    base, _ = cuda_overhead.make_cases(device)
    cases = {name: (fn, max(1, calls // 10)) for name, (fn, calls) in base.items()
             if not name.startswith(("mixed", "view", "mul (1M)"))}
    g = torch.Generator().manual_seed(1)
    s = torch.randn(64, 1024, generator=g).to(device)
    cases["silu 64x1024"] = (lambda: F.silu(s), 1000)
    cases["sum 64x1024 (dim -1)"] = (lambda: s.sum(-1), 1000)
    return cases


def served_by(cases):
    """case -> the aten operators one flagos call ran on FlagGems."""
    return {name: sorted(op.removeprefix("aten::") for op, backends in ops.items()
                         if "flaggems" in backends.split(","))
            for name, ops in cuda_overhead.routes_used(cases).items()}


def check(fns, name):
    """Sides whose result differs from CUDA's beyond the dtype's tolerance."""
    want = fns["cuda"]().float().cpu()
    tol = dict(rtol=1.6e-2, atol=1e-1) if "bf16" in name else dict(rtol=1e-4, atol=1e-4)
    bad = []
    for side in ("flagos", "use_gems"):
        got = fns[side]().float().cpu()
        if not torch.allclose(got, want, **tol):
            bad.append(side)
    return bad


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every case's calls per timed block (default 1)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    if not torch.cuda.is_available():
        print("skipped: no GPU (torch.cuda.is_available() is False)")
        return 0
    import torch_fl

    if torch_fl.driver() != "cuda" or not torch_fl.is_flaggems_enabled():
        print(f"skipped: needs the cuda driver with FlagGems (driver {torch_fl.driver()!r}, "
              f"flaggems {'on' if torch_fl.is_flaggems_enabled() else 'off'})")
        return 0
    import flag_gems

    t_start = time.monotonic()
    flagos = make_cases("flagos")
    cuda = make_cases("cuda")
    gems_ctx = flag_gems.use_gems  # a fresh context manager per use
    ctx = {"flagos": contextlib.nullcontext, "cuda": contextlib.nullcontext, "use_gems": gems_ctx}
    fns_of = {"flagos": flagos, "cuda": cuda, "use_gems": cuda}

    # Warm-up: routes, Triton compilation and autotuning, on every side.
    for side in SIDES:
        with ctx[side]():
            for fn, _ in fns_of[side].values():
                for _ in range(3):
                    fn()
    torch.cuda.synchronize()
    served = served_by(flagos)
    differ = {}
    for name in flagos:
        fns = {}
        for side in SIDES:
            def run(side=side):
                with ctx[side]():
                    return fns_of[side][name][0]()
            fns[side] = run
        bad = check(fns, name)
        if bad:
            differ[name] = bad

    # Each round times every case on each side, the sides in rotating order;
    # use_gems() is entered once per round (entering registers ~400 kernels).
    times = {name: {side: [] for side in SIDES} for name in flagos}
    for r in range(args.rounds):
        gc.collect()
        for side in SIDES[r % 3:] + SIDES[:r % 3]:
            with ctx[side]():
                for name in flagos:
                    calls = max(1, int(flagos[name][1] * args.scale))
                    times[name][side].append(timed_block(fns_of[side][name][0], calls)[0])
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    rows = []
    for name in flagos:
        calls = max(1, int(flagos[name][1] * args.scale))
        med = statistics.median
        t = times[name]
        row = {"op": name, "calls": calls, "served_by": served[name]}
        for side in SIDES:
            row[f"{side}_us"] = med(t[side]) * 1e6
        row["flagos/cuda"] = med([a / b for a, b in zip(t["flagos"], t["cuda"])])
        row["use_gems/cuda"] = med([a / b for a, b in zip(t["use_gems"], t["cuda"])])
        row["flagos/use_gems"] = med([a / b for a, b in zip(t["flagos"], t["use_gems"])])
        rows.append(row)
    seconds = time.monotonic() - t_start

    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
        "flag_gems": getattr(flag_gems, "__version__", "?"), "cpu_count": os.cpu_count(),
        "rounds": args.rounds, "scale": args.scale, "seconds": round(seconds, 1),
        "results_differ": differ,
        "method": "host us = (N back-to-back calls + one torch.cuda.synchronize()) / N; "
                  "R rounds, the three sides in rotating order; ratios = medians of "
                  "per-round ratios",
    }
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, flag_gems "
          f"{meta['flag_gems']}, {args.rounds} rounds, {seconds:.0f} s")
    w = max(len(r["op"]) for r in rows) + 2
    print(f"{'op':<{w}} {'flagos us':>10} {'cuda us':>8} {'use_gems us':>12} "
          f"{'fl/cuda':>8} {'gems/cuda':>10} {'fl/gems':>8}  served by FlagGems")
    for r in rows:
        print(f"{r['op']:<{w}} {r['flagos_us']:>10.1f} {r['cuda_us']:>8.1f} "
              f"{r['use_gems_us']:>12.1f} {r['flagos/cuda']:>8.2f} {r['use_gems/cuda']:>10.2f} "
              f"{r['flagos/use_gems']:>8.2f}  {', '.join(r['served_by']) or '(none: cuda)'}")
    if differ:
        print("WARNING: results differ from CUDA's: " +
              "; ".join(f"{k}: {', '.join(v)}" for k, v in differ.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
