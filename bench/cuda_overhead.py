"""Per-op host time of flagos (cuda driver) against native CUDA eager.

Run with every operator on the cuda route (FLAGOS_BACKEND_CONFIG naming a file
that says ``* = cuda``, as scripts/gpu_check.sh does): both sides then run the
same CUDA kernels (flagos through its routing path and zero-copy views), so the
difference is host overhead. Under another routing the JSON's ``routes`` record
says which backend served each row. Method (docs/benchmarks.md):

- host time of a case = wall time of one timed block / N, where a block is N
  back-to-back calls (after a short untimed warm-up and a synchronize) followed
  by one torch.cuda.synchronize(), so the work issued is also done. The cases
  are small enough that the GPU keeps up with the host, except where noted:
  the 4096x4096 bf16 mm is device-bound by design (its device time is the
  point), and the 1M-element add/mul are marked when the GPU sets their pace;
- R rounds (default 7); in each, flagos and CUDA are timed one after the
  other, alternating which goes first; the ratio reported is the median of
  the per-round ratios flagos/cuda (times: medians of the rounds);
- an A/A row (CUDA against CUDA, add on 1 element) gives the method's noise;
- device time per call ("gpu us"), measured apart for both sides with CUDA
  events: the stream is held by a spin kernel (torch.cuda._sleep) while the
  calls are queued, so the events time the kernels back to back, without
  host gaps. A case is "device-bound" (*) when CUDA's device time is at least
  80% of its host time: its ratio then says little about host overhead;
- the mixed row is one fixed pseudo-random sequence of 2,000 of the small ops
  (seeded), reported per op; its device time is the sum of the rows' device
  times over the sequence;
- the AdamW row is one `optimizer.step()` (foreach) over 311 parameters of
  1,024 floats with their gradients, the length of Qwen3-0.6B's parameter
  list: `_foreach_*` calls over lists of 311 to 933 tensors.

    PYTHONPATH=. python bench/cuda_overhead.py [--rounds 7] [--scale 1] [--json out.json]

Without a GPU, or when torch_fl did not select the cuda driver, it prints
"skipped: no GPU ..." and exits with status 0.
"""

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MIXED_OPS = 2000
SLICES = 10  # blocks per side and round, alternated (see compare)
SMALL = ("add (1)", "mul (1)", "mm 64x64 f32", "softmax 64x1024", "layer_norm 64x1024",
         "embedding 32000x512 [64]", "cat 8 x 128x128", "index_select 1024x128 [64]",
         "view + add_ (8x16)")


def make_cases(device):
    """name -> (fn, calls per timed block at --scale 1). Same data on every device."""
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    a1, b1 = rnd(1), rnd(1)
    am, bm = rnd(1 << 20), rnd(1 << 20)
    m1, m2 = rnd(64, 64), rnd(64, 64)
    big1, big2 = rnd(4096, 4096, dtype=torch.bfloat16), rnd(4096, 4096, dtype=torch.bfloat16)
    s = rnd(64, 1024)
    w, b = rnd(1024), rnd(1024)
    table = rnd(32000, 512)
    idx = torch.randint(0, 32000, (64,), generator=g).to(device)
    parts = [rnd(128, 128) for _ in range(8)]
    src = rnd(1024, 128)
    idx2 = torch.randint(0, 1024, (64,), generator=g).to(device)
    v = rnd(8, 16)
    small = 10000
    cases = {
        "add (1)": (lambda: a1 + b1, small),
        "mul (1)": (lambda: a1 * b1, small),
        "add (1M)": (lambda: am + bm, small),
        "mul (1M)": (lambda: am * bm, small),
        "mm 64x64 f32": (lambda: torch.mm(m1, m2), small),
        "mm 4096x4096 bf16": (lambda: torch.mm(big1, big2), 100),
        "softmax 64x1024": (lambda: torch.softmax(s, -1), small),
        "layer_norm 64x1024": (lambda: F.layer_norm(s, (1024,), w, b), small),
        "embedding 32000x512 [64]": (lambda: F.embedding(idx, table), small),
        "cat 8 x 128x128": (lambda: torch.cat(parts, 0), small),
        "index_select 1024x128 [64]": (lambda: torch.index_select(src, 0, idx2), small),
        "view + add_ (8x16)": (lambda: v.view(128)[:64].add_(1.0), small),
    }
    # An optimizer step over a model's parameter list (Qwen3-0.6B has 311
    # tensors): AdamW's `_foreach_*` calls take lists of 311 to 933 tensors.
    params = [torch.nn.Parameter(rnd(1024)) for _ in range(311)]
    for p in params:
        p.grad = rnd(1024)
    opt = torch.optim.AdamW(params, lr=1e-4, foreach=True)

    def adamw_step():
        opt.step()
        return params[0]  # what check_same compares across devices

    cases["AdamW step, 311 tensors (foreach)"] = (adamw_step, 100)
    order = random.Random(0).choices(SMALL, k=MIXED_OPS)
    seq = [cases[name][0] for name in order]

    def mixed():
        for fn in seq:
            fn()

    cases[f"mixed {MIXED_OPS}-op sequence (per op)"] = (mixed, 5)
    return cases, order


def per_call(name):
    """Calls (ops) in one call of the case: the mixed sequence counts its ops."""
    return MIXED_OPS if name.startswith("mixed") else 1


def timed_block(fn, n):
    """(host seconds per call incl. the final synchronize, issue seconds per call)."""
    for _ in range(max(1, min(50, n // 10))):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t2 - t0) / n, (t1 - t0) / n


def compare(fa, fb, rounds, calls, slices=SLICES):
    """Medians and per-round ratios of a against b.

    A round splits each side's N calls into `slices` blocks and alternates
    them (a b a b ..., the first side alternating between rounds), so that
    machine noise slower than a block (clock changes, other tenants' load)
    falls on both sides alike; the round's ratio is the ratio of the sums.
    Python's garbage collector is off while timing.
    """
    ratios, ta, tb, ia, ib = [], [], [], [], []
    per = max(1, calls // slices)
    for r in range(rounds):
        gc.collect()
        gc.disable()
        try:
            a = b = a_issue = b_issue = 0.0
            for k in range(slices):
                first_a = (r + k) % 2 == 0
                for side in ((fa, "a"), (fb, "b")) if first_a else ((fb, "b"), (fa, "a")):
                    t, i = timed_block(side[0], per)
                    if side[1] == "a":
                        a, a_issue = a + t, a_issue + i
                    else:
                        b, b_issue = b + t, b_issue + i
        finally:
            gc.enable()
        ratios.append(a / b)
        ta.append(a / slices)
        tb.append(b / slices)
        ia.append(a_issue / slices)
        ib.append(b_issue / slices)
    med = statistics.median
    return {"ratio": med(ratios), "a": med(ta), "b": med(tb),
            "a_issue": med(ia), "b_issue": med(ib), "rounds": ratios}


class DeviceTimer:
    """Device time per call: the calls are queued behind a spin kernel, so the
    events around them time the kernels back to back."""

    def __init__(self):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm
        s.record()
        torch.cuda._sleep(cycles)
        e.record()
        e.synchronize()
        self.cycles_per_ms = cycles / max(s.elapsed_time(e), 1e-3)

    def __call__(self, fn, n, host_s_per_call, repeats=3):
        hold_ms = 2.0 + 2e3 * n * host_s_per_call  # twice the time to queue the calls
        out = []
        for _ in range(repeats):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            torch.cuda._sleep(int(hold_ms * self.cycles_per_ms))
            s.record()
            for _ in range(n):
                fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) * 1e-3 / n)
        return statistics.median(out)


def check_same(flagos, cuda):
    """Names of the cases whose flagos result differs from CUDA's (a sanity check:
    the same kernels on the same data give the same bits)."""
    bad = []
    for name in flagos:
        if name.startswith(("mixed", "view")):
            continue
        x, y = flagos[name][0](), cuda[name][0]()
        if x.device.type != "flagos" or not torch.equal(x.cpu(), y.cpu()):
            bad.append(name)
    return bad


def routes_used(cases):
    """case -> {operator: backend} that served one call (torch_fl.routing.stats)."""
    import torch_fl

    out = {}
    for name, (fn, _) in cases.items():
        if name.startswith("mixed"):
            continue
        torch_fl.routing.reset_stats()
        fn()
        out[name] = {s.op: ",".join(sorted(s.calls)) for s in torch_fl.routing.stats()
                     if sum(s.calls.values())}
    torch.cuda.synchronize()
    return out


def no_cuda_driver():
    """Why the flagos-against-CUDA benchmarks cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no GPU (torch.cuda.is_available() is False)"
    import torch_fl

    if torch_fl.driver() != "cuda":
        return (f"no GPU driver in torch_fl: its driver is {torch_fl.driver()!r}, not 'cuda' "
                f"(FLAGOS_ACCELERATOR={os.environ.get('FLAGOS_ACCELERATOR', 'auto')!r})")
    return None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every case's calls per timed block (default 1)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)

    skip = no_cuda_driver()
    if skip:
        print(f"skipped: {skip}")
        return 0
    import torch_fl

    t_start = time.monotonic()
    flagos, order = make_cases("flagos")
    cuda, _ = make_cases("cuda")
    for cases in (flagos, cuda):  # first calls: routes, handles, kernels
        for fn, _ in cases.values():
            for _ in range(3):
                fn()
    torch.cuda.synchronize()
    differ = check_same(flagos, cuda)
    routes = routes_used(flagos)
    timer = DeviceTimer()

    rows = []

    def add_row(name, res, calls, gpu_fl, gpu_cu):
        k = per_call(name)
        host_cu = res["b"] / k
        rows.append({
            "op": name, "calls": calls * k,
            "flagos_us": res["a"] / k * 1e6, "cuda_us": host_cu * 1e6,
            "ratio": res["ratio"], "rounds": res["rounds"],
            "flagos_issue_us": res["a_issue"] / k * 1e6, "cuda_issue_us": res["b_issue"] / k * 1e6,
            "flagos_gpu_us": None if gpu_fl is None else gpu_fl * 1e6,
            "cuda_gpu_us": None if gpu_cu is None else gpu_cu * 1e6,
            "device_bound": gpu_cu is not None and gpu_cu >= 0.8 * host_cu,
        })

    aa_fn, aa_calls = cuda["add (1)"]
    aa_calls = max(1, int(aa_calls * args.scale))
    add_row("A/A: cuda add (1) vs cuda add (1)",
            compare(aa_fn, aa_fn, args.rounds, aa_calls), aa_calls, None, None)
    gpu = {}
    for name in flagos:
        calls = max(1, int(flagos[name][1] * args.scale))
        res = compare(flagos[name][0], cuda[name][0], args.rounds, calls)
        if name.startswith("mixed"):
            gpu_fl = sum(gpu[o][0] for o in order) / MIXED_OPS
            gpu_cu = sum(gpu[o][1] for o in order) / MIXED_OPS
        else:
            n = min(calls, 200)
            gpu_fl = timer(flagos[name][0], n, res["a"])
            gpu_cu = timer(cuda[name][0], n, res["b"])
            gpu[name] = (gpu_fl, gpu_cu)
        add_row(name, res, calls, gpu_fl, gpu_cu)
    seconds = time.monotonic() - t_start

    props = torch.cuda.get_device_properties(0)
    flagos_env = {k: v for k, v in os.environ.items() if k.startswith("FLAGOS_")}
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": props.name,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "driver": torch_fl.driver(), "flaggems": torch_fl.is_flaggems_enabled(),
        "flagos_env": flagos_env, "rounds": args.rounds, "scale": args.scale,
        "seconds": round(seconds, 1), "results_differ": differ, "routes": routes,
        "method": "host us = (N back-to-back calls + one torch.cuda.synchronize()) / N; "
                  f"R rounds; a round alternates {SLICES} blocks of N/{SLICES} calls per side, "
                  "the first side alternating; round ratio = sum over blocks; "
                  "ratio = median of per-round ratios; gpu us = CUDA-event time per call "
                  "with the calls queued behind a spin kernel",
    }

    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), {props.name}, driver "
          f"{torch_fl.driver()}, flaggems {'on' if meta['flaggems'] else 'off'}, "
          f"{meta['cpu']} x{os.cpu_count()}, {torch.get_num_threads()} threads, "
          f"{args.rounds} rounds, {seconds:.0f} s"
          + (f", env {flagos_env}" if flagos_env else ""))
    w = max(len(r["op"]) for r in rows) + 2
    print(f"{'op':<{w}} {'flagos us':>10} {'cuda us':>9} {'ratio':>6}  "
          f"{'gpu us fl/cu':>14}   per-round ratios")
    for r in rows:
        gpu_col = ("-" if r["cuda_gpu_us"] is None
                   else f"{r['flagos_gpu_us']:.2f}/{r['cuda_gpu_us']:.2f}")
        mark = "*" if r["device_bound"] else " "
        spread = " ".join(f"{x:.2f}" for x in r["rounds"])
        print(f"{r['op']:<{w}} {r['flagos_us']:>10.2f} {r['cuda_us']:>9.2f} "
              f"{r['ratio']:>6.2f}{mark} {gpu_col:>14}   {spread}")
    print("* device-bound: CUDA's device time is >= 80% of its host time, so the GPU "
          "sets the pace and the ratio says little about host overhead")
    if differ:
        print("WARNING: flagos results differ from CUDA's for: " + ", ".join(differ))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
