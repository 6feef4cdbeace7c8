"""Per-op host time of FlagGems' kernels on flagos, launched from C++ and through Python, against CUDA.

Sides, timed in one process:

- flagos: flagos tensors, default routing: FlagGems' Triton kernel launched from
  C++ (csrc/flaggems, docs/flaggems_cpp.md) for the operators it describes;
- flagos-python: the same with the C++ path off (torch_fl.flaggems.set_cpp_enabled(False)):
  FlagGems' Python wrapper and Triton's launcher, as before issue 13;
- cuda: plain CUDA tensors, PyTorch's CUDA kernels (the baseline);
- use_gems (--use-gems): plain CUDA tensors inside ``flag_gems.use_gems()``.

Cases and the timing method are bench/cuda_overhead.py's (docs/benchmarks.md):
host time = (N back-to-back calls + one synchronize) / N; R rounds, each timing
every case on every side in a rotating order; ratios are medians of the
per-round ratios. An A/A row (CUDA against CUDA) gives the method's noise. The
device time per call of both flagos and CUDA is measured apart (calls queued
behind a spin kernel); a case is device-bound (*) when flagos' device time is
at least 80% of its host time: its ratio then measures the kernel, not the
launch. "served" lists the aten operators one flagos call ran on FlagGems,
with the path taken (c++ / python). Checks: flagos and flagos-python give the
same bits (the C++ path launches FlagGems' kernel with FlagGems' arguments),
and both match CUDA within the dtype's tolerance.

    PYTHONPATH=. python bench/flaggems_ops.py [--rounds 7] [--scale 1] [--use-gems] [--json out.json]

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
from cuda_overhead import DeviceTimer, timed_block  # noqa: E402


def make_cases(device):
    """name -> (fn, calls per timed block at --scale 1): cuda_overhead's single
    ops (the same data) plus the operators a Qwen3 step sends to FlagGems."""
    base, _ = cuda_overhead.make_cases(device)
    cases = {name: (fn, max(1, calls // 5)) for name, (fn, calls) in base.items()
             if not name.startswith(("mixed", "view", "mul (1M)", "mm 4096"))}
    g = torch.Generator().manual_seed(1)
    s = torch.randn(64, 1024, generator=g).to(device)
    t = torch.randn(64, 1024, generator=g).to(device)
    h = torch.randn(1, 16, 64, generator=g).to(torch.bfloat16).to(device)
    kv = torch.randn(1, 8, 100, 64, generator=g).to(torch.bfloat16).to(device)
    step = torch.randn(1, 8, 1, 64, generator=g).to(torch.bfloat16).to(device)
    a = torch.randn(16, 32, 64, generator=g).to(device)
    b = torch.randn(16, 64, 32, generator=g).to(device)
    logits = torch.randn(2, 151936, generator=g).to(torch.bfloat16).to(device)
    n = 2000
    cases.update({
        "add 64x1024": (lambda: s + t, n),
        "silu 64x1024": (lambda: F.silu(s), n),
        "rsqrt 64x1024": (lambda: torch.rsqrt(s), n),
        "neg bf16 1x16x64": (lambda: -h, n),
        "mean 64x1024 (dim -1, keepdim)": (lambda: s.mean(-1, keepdim=True), n),
        "where 64x1024": (lambda: torch.where(s > 0, s, t), n),
        "cat KV cache bf16 (dim 2)": (lambda: torch.cat([kv, step], 2), n),
        "bmm 16x32x64 @ 16x64x32": (lambda: torch.bmm(a, b), n),
        "argmax bf16 2x151936": (lambda: logits.argmax(-1), n // 4),
    })
    return cases


def served(cases):
    """case -> the aten operators one flagos call ran on FlagGems, with the path."""
    import torch_fl

    out = {}
    for name, (fn, _) in cases.items():
        torch_fl.routing.reset_stats()
        fn()
        ops = []
        for st in torch_fl.routing.stats():
            paths = [p for p, k in (("c++", "flaggems"), ("python", "flaggems-python")) if st.calls.get(k)]
            if paths:
                ops.append(f"{st.op.removeprefix('aten::')} [{'+'.join(paths)}]")
        out[name] = sorted(ops)
    torch.cuda.synchronize()
    return out


def same_bits(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(
        x.cpu().contiguous().view(torch.uint8) if x.dtype.is_floating_point else x.cpu(),
        y.cpu().contiguous().view(torch.uint8) if y.dtype.is_floating_point else y.cpu())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every case's calls per timed block (default 1)")
    p.add_argument("--use-gems", action="store_true", help="also time flag_gems.use_gems() on CUDA")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    skip = cuda_overhead.no_cuda_driver()
    if skip:
        print(f"skipped: {skip}")
        return 0
    import torch_fl

    if not torch_fl.is_flaggems_enabled():
        print("skipped: FlagGems serves no operator here (torch_fl.is_flaggems_enabled() is False: "
              "is flag_gems importable?)")
        return 0
    import flag_gems

    cpp = torch_fl.flaggems

    @contextlib.contextmanager
    def python_path():
        cpp.set_cpp_enabled(False)
        try:
            yield
        finally:
            cpp.set_cpp_enabled(True)

    sides = ["flagos", "flagos-python", "cuda"] + (["use_gems"] if args.use_gems else [])
    t_start = time.monotonic()
    flagos = make_cases("flagos")
    cuda = make_cases("cuda")
    ctx = {"flagos": contextlib.nullcontext, "flagos-python": python_path,
           "cuda": contextlib.nullcontext, "use_gems": flag_gems.use_gems}
    fns_of = {"flagos": flagos, "flagos-python": flagos, "cuda": cuda, "use_gems": cuda}

    # Warm-up: routes, Triton compilation, autotuning, C++ admission, on every side.
    for side in sides:
        with ctx[side]():
            for fn, _ in fns_of[side].values():
                for _ in range(3):
                    fn()
    torch.cuda.synchronize()
    path = served(flagos)
    differ, not_bitwise = {}, []
    for name in flagos:
        if name.startswith("AdamW"):
            # Stateful: the two flagos sides share one optimizer, which has
            # taken twice CUDA's steps by now, so its values cannot agree.
            continue
        want = cuda[name][0]()
        got = flagos[name][0]()
        with python_path():
            py = flagos[name][0]()
        if not same_bits(got, py):
            not_bitwise.append(name)
        tol = dict(rtol=1.6e-2, atol=1e-1) if got.dtype in (torch.bfloat16, torch.float16) else \
            dict(rtol=1e-4, atol=1e-4)
        # NaN where CUDA has NaN agrees (rsqrt of negative samples).
        if got.dtype.is_floating_point and not torch.allclose(got.float().cpu(), want.float().cpu(),
                                                              equal_nan=True, **tol):
            differ[name] = "flagos"
        elif not got.dtype.is_floating_point and not torch.equal(got.cpu(), want.cpu()):
            differ[name] = "flagos"

    times = {name: {side: [] for side in sides} for name in flagos}
    aa = []
    aa_fn, aa_calls = cuda["add (1)"]
    aa_calls = max(1, int(aa_calls * args.scale))
    for r in range(args.rounds):
        gc.collect()
        order = sides[r % len(sides):] + sides[:r % len(sides)]
        for side in order:
            with ctx[side]():
                for name in flagos:
                    calls = max(1, int(flagos[name][1] * args.scale))
                    times[name][side].append(timed_block(fns_of[side][name][0], calls)[0])
        a = timed_block(aa_fn, aa_calls)[0]
        b = timed_block(aa_fn, aa_calls)[0]
        aa.append(a / b)
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    timer = DeviceTimer()
    med = statistics.median
    rows = [{"op": "A/A: cuda add (1) vs cuda add (1)", "flagos/cuda": med(aa)}]
    for name in flagos:
        calls = max(1, int(flagos[name][1] * args.scale))
        t = times[name]
        row = {"op": name, "calls": calls, "served": path[name]}
        for side in sides:
            row[f"{side}_us"] = med(t[side]) * 1e6
        row["flagos/cuda"] = med([x / y for x, y in zip(t["flagos"], t["cuda"])])
        row["python/cuda"] = med([x / y for x, y in zip(t["flagos-python"], t["cuda"])])
        if args.use_gems:
            row["use_gems/cuda"] = med([x / y for x, y in zip(t["use_gems"], t["cuda"])])
        n = min(calls, 200)
        row["flagos_gpu_us"] = timer(flagos[name][0], n, med(t["flagos"])) * 1e6
        row["cuda_gpu_us"] = timer(cuda[name][0], n, med(t["cuda"])) * 1e6
        row["device_bound"] = row["flagos_gpu_us"] >= 0.8 * row["flagos_us"]
        rows.append(row)
    seconds = time.monotonic() - t_start

    props = torch.cuda.get_device_properties(0)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
        "flag_gems": getattr(flag_gems, "__version__", "?"), "cpu_count": os.cpu_count(),
        "rounds": args.rounds, "scale": args.scale, "seconds": round(seconds, 1),
        "results_differ_from_cuda": differ, "cpp_not_bitwise_python": not_bitwise,
        "cpp_stats": {k: v for k, v in cpp.cpp_stats().items() if k != "ops"},
        "method": "host us = (N back-to-back calls + one torch.cuda.synchronize()) / N; "
                  "R rounds, the sides in rotating order; ratios = medians of per-round ratios; "
                  "gpu us = CUDA-event time per call with the calls queued behind a spin kernel",
    }
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, flag_gems "
          f"{meta['flag_gems']}, {args.rounds} rounds, {seconds:.0f} s")
    w = max(len(r["op"]) for r in rows) + 2
    print(f"{'op':<{w}} {'c++ us':>8} {'python us':>10} {'cuda us':>8} {'c++/cuda':>9} "
          f"{'py/cuda':>8} {'gpu us c++/cuda':>16}  served by FlagGems")
    for r in rows:
        if "calls" not in r:
            print(f"{r['op']:<{w}} {'':>8} {'':>10} {'':>8} {r['flagos/cuda']:>9.2f}")
            continue
        mark = "*" if r["device_bound"] else " "
        print(f"{r['op']:<{w}} {r['flagos_us']:>8.1f} {r['flagos-python_us']:>10.1f} "
              f"{r['cuda_us']:>8.1f} {r['flagos/cuda']:>8.2f}{mark} {r['python/cuda']:>8.2f} "
              f"{r['flagos_gpu_us']:>7.1f}/{r['cuda_gpu_us']:<7.1f}  "
              f"{', '.join(r['served']) or '(none: cuda)'}")
    print("* device-bound: flagos' device time is >= 80% of its host time (the kernel, not the "
          "launch, sets the pace)")
    if not_bitwise:
        print("WARNING: C++ and Python paths give different bits for: " + ", ".join(not_bitwise))
    if differ:
        print("WARNING: results differ from CUDA's beyond tolerance: " + ", ".join(differ))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
