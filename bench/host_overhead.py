"""Per-op host overhead of the flagos device (host driver) against native CPU eager.

Each op runs on small tensors, so the time is host overhead (Python, dispatch,
routing, views), not arithmetic. Method (see docs/benchmarks.md): R rounds;
in each, flagos and CPU are timed over N calls in 10 alternating blocks per
side; the reported ratio is the median of the per-round ratios. An A/A row (CPU
against CPU) gives the noise of the method on this machine.

    python bench/host_overhead.py [--rounds 7] [--calls 20000] [--json out.json]
"""

import argparse
import gc
import json
import platform
import statistics
import time

import torch

import torch_fl  # noqa: F401


def make_cases(device):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, generator=g).to(device)
    b = torch.randn(16, generator=g).to(device)
    m1 = torch.randn(64, 64, generator=g).to(device)
    m2 = torch.randn(64, 64, generator=g).to(device)
    s = torch.randn(8, 32, generator=g).to(device)
    v = torch.randn(8, 16, generator=g).to(device)
    return {
        "add (16)": lambda: a + b,
        "mul (16)": lambda: a * b,
        "mm 64x64": lambda: torch.mm(m1, m2),
        "softmax (8x32)": lambda: torch.softmax(s, -1),
        "view + add_ (8x16)": lambda: v.view(128)[:64].add_(1.0),
    }


SLICES = 10  # blocks per side and round, alternated (see compare)


def time_calls(fn, calls):
    for _ in range(min(200, calls)):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def compare(fa, fb, rounds, calls, slices=SLICES):
    """Per-round ratios of a against b. A round alternates `slices` blocks of
    calls/slices per side (the first side alternating), so that noise slower
    than a block falls on both sides alike; Python's GC is off while timing."""
    ratios, ta, tb = [], [], []
    per = max(1, calls // slices)
    for r in range(rounds):
        gc.collect()
        gc.disable()
        try:
            a = b = 0.0
            for k in range(slices):
                if (r + k) % 2 == 0:
                    a += time_calls(fa, per)
                    b += time_calls(fb, per)
                else:
                    b += time_calls(fb, per)
                    a += time_calls(fa, per)
        finally:
            gc.enable()
        ratios.append(a / b)
        ta.append(a / slices)
        tb.append(b / slices)
    return statistics.median(ratios), statistics.median(ta), statistics.median(tb), ratios


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    torch.set_num_threads(1)

    flagos, cpu = make_cases("flagos"), make_cases("cpu")
    rows = []
    aa = compare(cpu["add (16)"], cpu["add (16)"], args.rounds, args.calls)
    rows.append(("A/A: cpu add vs cpu add", *aa))
    for name in flagos:
        rows.append((name, *compare(flagos[name], cpu[name], args.rounds, args.calls)))

    print(f"torch {torch.__version__}, driver {torch_fl.driver()}, {platform.processor() or platform.machine()}, "
          f"{args.rounds} rounds x {args.calls} calls, 1 thread")
    print(f"{'op':<26} {'flagos us':>10} {'cpu us':>8} {'ratio':>7}   per-round ratios")
    for name, ratio, ta, tb, ratios in rows:
        spread = " ".join(f"{r:.2f}" for r in ratios)
        print(f"{name:<26} {ta * 1e6:>10.2f} {tb * 1e6:>8.2f} {ratio:>7.2f}   {spread}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"op": n, "ratio": r, "flagos_us": a * 1e6, "cpu_us": b * 1e6, "rounds": rs}
                       for n, r, a, b, rs in rows], f, indent=1)


if __name__ == "__main__":
    main()
