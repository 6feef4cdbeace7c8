"""Runs one case of bench/cuda_overhead.py (or bench/host_overhead.py on the host
driver) in a loop for a while, so that a native sampling profiler can attribute
its host time:

    py-spy record --native -r 2000 -f raw -o flagos_add.txt -- \\
        python scripts/profile_op.py --device flagos --case "add (1)" --seconds 10

The raw (collapsed-stack) output of two devices, compared per frame, shows
where flagos' per-op time goes beyond the native device's.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="flagos")
    p.add_argument("--case", default="add (1)")
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    import torch
    import torch_fl  # noqa: F401

    if torch.cuda.is_available():
        import cuda_overhead as bench

        cases, _ = bench.make_cases(a.device)
        fn = cases[a.case][0]
        sync = torch.cuda.synchronize
    else:
        import host_overhead as bench

        fn = bench.make_cases(a.device)[a.case]
        sync = lambda: None  # noqa: E731
    for _ in range(1000):
        fn()
    sync()
    end = time.monotonic() + a.seconds
    n = 0
    while time.monotonic() < end:
        for _ in range(1000):
            fn()
        sync()
        n += 1000
    print(f"{a.device} {a.case}: {n} calls, {a.seconds * 1e6 / n:.2f} us per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
