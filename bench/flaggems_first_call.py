"""First-call cost of FlagGems operators on flagos: cold caches, warm caches, C++ path on and off.

The first call of a new kernel specialization pays for Triton's compilation
(or its cache), FlagGems' code generation and autotuning, and, with the C++
launch path, the capture that checks the C++ plan against FlagGems' wrapper.
Each configuration is a fresh process (import time reported apart) timing the
first and the second call of each case (torch.cuda.synchronize around each):

- python cold:  FLAGOS_FLAGGEMS_CPP=0, empty Triton and FlagGems caches (as before issue 13);
- c++ cold:     the C++ path, empty Triton, FlagGems and torch_fl kernel caches;
- python warm:  FLAGOS_FLAGGEMS_CPP=0 again, the Triton and FlagGems caches now warm;
- c++ warm:     the C++ path, every cache warm (torch_fl's disk cache: no capture, no Triton);
- c++ warm, triton cold: torch_fl's disk cache alone (Triton's cache emptied again).

    PYTHONPATH=. python bench/flaggems_first_call.py [--json out.json]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch, torch_fl, torch.nn.functional as F
t_import = time.perf_counter() - t0
g = torch.Generator().manual_seed(0)
def r(*s, dt=torch.float32):
    return torch.randn(*s, generator=g).to(dt).to("flagos")
x, y = r(8, 1024), r(8, 1024)
xb = r(2, 16, 64, dt=torch.bfloat16)
kv, st = r(1, 8, 33, 64, dt=torch.bfloat16), r(1, 8, 1, 64, dt=torch.bfloat16)
idx = torch.randint(0, 1000, (16,), generator=g).to("flagos")
table = r(1000, 256)
a, b = r(4, 32, 64), r(4, 64, 32)
cases = {
    "add": lambda: x + y,
    "silu bf16": lambda: F.silu(xb),
    "rsqrt": lambda: torch.rsqrt(x.abs()),
    "mean.dim": lambda: x.mean(-1, keepdim=True),
    "softmax": lambda: torch.softmax(x, -1),
    "cat (KV cache)": lambda: torch.cat([kv, st], 2),
    "embedding": lambda: F.embedding(idx, table),
    "bmm (autotuned)": lambda: torch.bmm(a, b),
}
out = {"import_s": t_import, "cases": {}}
torch.flagos.synchronize()
for name, fn in cases.items():
    ts = []
    for _ in range(2):
        t = time.perf_counter(); fn(); torch.flagos.synchronize(); ts.append(time.perf_counter() - t)
    out["cases"][name] = ts
s = torch_fl.flaggems.cpp_stats() if torch_fl.flaggems.cpp_ops() else {}
out["cpp"] = {k: v for k, v in s.items() if k not in ("ops", "pinned")}
out["pinned"] = s.get("pinned", [])
print("@@first " + json.dumps(out))
"""

CONFIGS = ("python cold", "c++ cold", "python warm", "c++ warm", "c++ warm, triton cold")


def run(env) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tempfile.gettempdir())
    for line in p.stdout.splitlines():
        if line.startswith("@@first "):
            return json.loads(line[len("@@first "):])
    raise RuntimeError(f"child exited {p.returncode}\n{p.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 0
    root = tempfile.mkdtemp(prefix="flaggems-first-call-")
    dirs = {k: os.path.join(root, k) for k in ("triton", "flaggems", "flagos", "triton-py", "flaggems-py")}
    base = dict(os.environ)
    for k in ("FLAGOS_FLAGGEMS_CPP", "FLAGOS_DISABLE_FLAGGEMS_PY"):
        base.pop(k, None)

    def env(cpp, triton, flaggems):
        e = dict(base, TRITON_CACHE_DIR=triton, FLAGGEMS_CACHE_DIR=flaggems,
                 FLAGOS_CACHE_DIR=dirs["flagos"])
        if not cpp:
            e["FLAGOS_FLAGGEMS_CPP"] = "0"
        return e

    results = {}
    try:
        results["python cold"] = run(env(False, dirs["triton-py"], dirs["flaggems-py"]))
        results["c++ cold"] = run(env(True, dirs["triton"], dirs["flaggems"]))
        results["python warm"] = run(env(False, dirs["triton-py"], dirs["flaggems-py"]))
        results["c++ warm"] = run(env(True, dirs["triton"], dirs["flaggems"]))
        shutil.rmtree(dirs["triton"], ignore_errors=True)
        results["c++ warm, triton cold"] = run(env(True, dirs["triton"], dirs["flaggems"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    names = list(results["c++ cold"]["cases"])
    w = max(len(n) for n in names) + 2
    print("first call ms (second call ms) per configuration; each a fresh process")
    print(f"{'case':<{w}}" + "".join(f"{c:>24}" for c in CONFIGS))
    for n in names:
        cells = []
        for c in CONFIGS:
            first, second = results[c]["cases"][n]
            cells.append(f"{first * 1e3:>14.1f} ({second * 1e3:>6.2f})")
        print(f"{n:<{w}}" + "".join(f"{x:>24}" for x in cells))
    totals = {c: sum(v[0] for v in results[c]["cases"].values()) for c in CONFIGS}
    print(f"{'sum of first calls':<{w}}" + "".join(f"{totals[c] * 1e3:>22.0f}ms" for c in CONFIGS))
    print(f"{'import torch_fl':<{w}}" + "".join(f"{results[c]['import_s'] * 1e3:>22.0f}ms" for c in CONFIGS))
    for c in CONFIGS:
        if results[c]["cpp"]:
            s = results[c]["cpp"]
            print(f"{c}: captures {s.get('captures')}, admitted {s.get('admitted')}, disk kernels "
                  f"{s.get('disk_kernels')}, disk configs {s.get('disk_tuned')}, launched {s.get('launched')}"
                  + (f", pinned {results[c]['pinned']}" if results[c]["pinned"] else ""))
    warm_saving = 1 - totals["c++ warm"] / max(totals["c++ cold"], 1e-9)
    print(f"warm torch_fl + Triton caches remove {warm_saving:.0%} of the cold first-call cost "
          f"(C++ cold {totals['c++ cold'] * 1e3:.0f} ms vs Python cold {totals['python cold'] * 1e3:.0f} ms)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"configs": results, "totals_s": totals,
                       "median_first_ms": {c: statistics.median(v[0] for v in results[c]["cases"].values()) * 1e3
                                           for c in CONFIGS}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
