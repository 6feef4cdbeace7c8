"""torch.distributed on 2+ GPUs: the flagos backend against NCCL on CUDA tensors.

Three "worlds" of N processes each (one process per GPU) live side by side:
``flagos`` (torch_fl's cuda driver, flagos tensors, ``init_process_group()``,
so the flagos backend over NCCL), ``cuda`` and ``cuda2`` (native CUDA tensors
and ProcessGroupNCCL, torch_fl not loaded: TORCH_DEVICE_BACKEND_AUTOLOAD=0).
The parent (which imports no torch) sends every world the same commands in
turn, so only one world uses the GPUs at a time. Rows:

- all_reduce bus bandwidth of a 256 MiB float32 tensor (NCCL's busbw:
  bytes * 2(n-1)/n / time), ``--iters`` back-to-back calls per round;
- DDP and FSDP2 (fully_shard per decoder layer, then the root) training step
  time of a Qwen3-shaped model (examples/qwen3_workload.py, ``--size``,
  AdamW), ``--steps`` steps per round, and the losses of every step compared
  between flagos and CUDA (same weights, same per-rank data);
- A/A: ``cuda2`` against ``cuda``: the method's noise.

R rounds (``--rounds``); in each, the worlds run one after the other,
alternating which goes first. "speed" = CUDA's time / flagos' time (for
bandwidth: flagos' busbw / CUDA's), the median of the per-round values; 0.95
or more is the target (issue 12).

    PYTHONPATH=. python bench/distributed.py [--gpus 2] [--rounds 5] [--size 0.6b] [--all-cuda]
                                             [--json out.json]

The step-time rows include flagos' per-operator cost of the model itself
(docs/benchmarks.md: the single-GPU Qwen3 step); ``--all-cuda`` takes FlagGems'
kernels out of that comparison.

Every process gets NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1 (the 2-GPU machines have no NVLink multicast). Without
2 GPUs it prints "skipped: ..." and exits with status 0.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
           "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(GPU_ENV)  # this process too, though it never touches the GPU

# ---- one rank of one world ------------------------------------------------------------------


def worker(world: str, size: str, dtype: str, batch: int, seq: int, smoke: bool) -> None:
    """Serves commands (JSON lines on stdin) until "exit"; answers on stdout."""
    import torch
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    n = int(os.environ["WORLD_SIZE"])
    if world == "flagos":
        import torch_fl  # noqa: F401

        assert torch_fl.driver() == ("host" if smoke else "cuda"), torch_fl.driver()
        torch.flagos.set_device(local)
        device = torch.device("flagos", local)
        sync = torch.flagos.synchronize
        dist.init_process_group()  # bare: the flagos backend for flagos tensors
        assert dist.distributed_c10d._get_default_group()._get_backend(
            device).name() == "flagos"
    elif smoke:  # the script's own test, without GPUs: CPU tensors on gloo
        device, sync = torch.device("cpu"), lambda: None
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        sync = torch.cuda.synchronize
        dist.init_process_group("cpu:gloo,cuda:nccl", device_id=device)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import qwen3_workload as qw

    state = {}

    def allreduce(mib, iters, warmup):
        t = torch.ones(mib * 2**20 // 4, device=device)
        for _ in range(warmup):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        sync()
        seconds = (time.perf_counter() - t0) / iters
        assert t[0].item() == float(n) ** (warmup + iters), t[0].item()  # sums of sums
        del t
        return {"seconds": seconds}

    def setup(mode):
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = qw.build_model(size, dtype=dtype, device=device, train=True)
        if mode == "ddp":
            model = DDP(model, device_ids=None if device.type == "cpu" else [local])
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh(device.type, (n,))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        state.update(model=model, step=0,
                     opt=torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True),
                     data=qw.train_batches(qw.config(size).vocab_size, batch, seq,
                                           seed=100 + rank, count=4).to(device))
        return {}

    def steps(count):
        model, opt, data = state["model"], state["opt"], state["data"]
        times, losses = [], []
        for _ in range(count):
            x = data[state["step"] % data.shape[0]]
            state["step"] += 1
            sync()
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(input_ids=x, labels=x, use_cache=False).loss
            loss.backward()
            opt.step()
            sync()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        return {"step_s": times, "losses": losses}

    def teardown():
        state.clear()
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return {}

    commands = {"allreduce": allreduce, "setup": setup, "steps": steps, "teardown": teardown}
    print("READY", flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "exit":
            break
        out = commands[msg["cmd"]](**msg.get("args", {}))
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ---- the parent -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class World:
    def __init__(self, name, gpus, args, log_dir):
        self.name, self.procs = name, []
        port = free_port()
        for rank in range(gpus):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(gpus), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            if name == "flagos":
                env["FLAGOS_ACCELERATOR"] = "host" if args.smoke else "cuda"
                env["FLAGOS_HOST_DEVICES"] = str(gpus)
                env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
                if args.all_cuda:
                    env["FLAGOS_BACKEND_CONFIG"] = args.all_cuda
            else:
                # native CUDA must never load torch_fl (pytorch/pytorch#161129)
                env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", name,
                   "--size", args.size, "--dtype", args.dtype, "--batch", str(args.batch),
                   "--seq", str(args.seq)] + (["--smoke"] if args.smoke else [])
            # the child has its own copy of the file: the parent's is closed at once
            with open(os.path.join(log_dir, f"{name}.rank{rank}.log"), "w") as log:
                self.procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE,
                                                   stdout=subprocess.PIPE, stderr=log,
                                                   text=True, cwd=ROOT))
        for p in self.procs:
            self._read(p, "READY")

    def _read(self, p, prefix):
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"world {self.name}: a worker died (logs in --logs)")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def run(self, cmd, **args):
        for p in self.procs:
            p.stdin.write(json.dumps({"cmd": cmd, "args": args}) + "\n")
            p.stdin.flush()
        outs = [json.loads(self._read(p, "RESULT ")) for p in self.procs]
        return outs[0]  # rank 0's view; every rank took part

    def close(self):
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"cmd": "exit"}) + "\n")
                p.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


def rounds_of(worlds, rounds, fn):
    """fn(world) -> value, for each world, R rounds, alternating the order."""
    values = {w.name: [] for w in worlds}
    for r in range(rounds):
        order = worlds if r % 2 == 0 else list(reversed(worlds))
        for w in order:
            values[w.name].append(fn(w))
    return values


def probe_torch() -> dict:
    """torch's versions and GPUs, from a subprocess that never initializes CUDA here."""
    out = subprocess.run(
        [sys.executable, "-c", "import torch; c = torch.cuda.is_available(); print(torch.__version__, "
         "torch.version.cuda, c and torch.cuda.nccl.version(), "
         "c and torch.cuda.get_device_properties(0).name, torch.cuda.device_count(), sep='|')"],
        env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), capture_output=True, text=True)
    info = out.stdout.strip().split("|") if out.returncode == 0 else []
    info += [""] * (5 - len(info))
    return {"torch": info[0], "cuda": info[1], "nccl": info[2], "gpu": info[3],
            "gpu_count": int(info[4] or 0)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=20, help="all_reduce calls per round")
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--size", default="0.6b", help="qwen3_workload size (tiny, small, 0.6b)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--steps", type=int, default=4, help="training steps per round")
    p.add_argument("--modes", default="ddp,fsdp2")
    p.add_argument("--all-cuda", action="store_true",
                   help="flagos routes every operator to CUDA's kernels ('* = cuda'), so the "
                        "step-time rows compare the distributed path, not FlagGems' kernels")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--logs", default=None, help="directory for the workers' stderr")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # CPU self-test
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.size, args.dtype, args.batch, args.seq, args.smoke)
        return 0

    torch_info = probe_torch()
    gpus = args.gpus if args.smoke else torch_info["gpu_count"]
    if gpus < args.gpus:
        print(f"skipped: needs {args.gpus} GPUs, torch.cuda sees {gpus}")
        return 0
    log_dir = args.logs or os.path.join("/tmp", f"flagos_bench_distributed_{os.getpid()}")
    os.makedirs(log_dir, exist_ok=True)
    if args.all_cuda:
        args.all_cuda = os.path.join(log_dir, "all_cuda.conf")
        with open(args.all_cuda, "w") as f:
            f.write("* = cuda\n")
    t_start = time.monotonic()
    worlds = [World(name, args.gpus, args, log_dir) for name in ("flagos", "cuda", "cuda2")]
    fl, cu, cu2 = worlds
    rows, losses = [], {}
    med = statistics.median

    def row(name, unit, a_vals, b_vals, speed):
        ratios = [speed(a, b) for a, b in zip(a_vals, b_vals)]
        rows.append({"row": name, "unit": unit, "flagos_or_a": med(a_vals), "cuda": med(b_vals),
                     "speed": med(ratios), "rounds": ratios})

    try:
        n = args.gpus
        nbytes = args.mib * 2**20

        def busbw(w):
            s = w.run("allreduce", mib=args.mib, iters=args.iters, warmup=3)["seconds"]
            return nbytes * 2 * (n - 1) / n / s / 1e9

        bw = rounds_of(worlds, args.rounds, busbw)
        row(f"A/A: all_reduce {args.mib} MiB busbw, cuda2 vs cuda", "GB/s", bw["cuda2"],
            bw["cuda"], lambda a, b: a / b)
        row(f"all_reduce {args.mib} MiB busbw, flagos vs NCCL", "GB/s", bw["flagos"],
            bw["cuda"], lambda a, b: a / b)

        for mode in [m for m in args.modes.split(",") if m]:
            for w in worlds:
                w.run("setup", mode=mode)
            for w in worlds:  # first steps: allocations, kernels, autotuning
                w.run("steps", count=2)
            trace = {w.name: [] for w in worlds}

            def step_time(w, trace=trace):
                out = w.run("steps", count=args.steps)
                trace[w.name].extend(out["losses"])
                return med(out["step_s"]) * 1e3

            times = rounds_of(worlds, args.rounds, step_time)
            for w in worlds:
                w.run("teardown")
            label = {"ddp": "DDP", "fsdp2": "FSDP2"}[mode]
            row(f"A/A: {label} step, cuda2 vs cuda", "ms", times["cuda2"], times["cuda"],
                lambda a, b: b / a)
            row(f"{label} step ({args.size} {args.dtype}), flagos vs CUDA", "ms",
                times["flagos"], times["cuda"], lambda a, b: b / a)
            diffs = [abs(a - b) for a, b in zip(trace["flagos"], trace["cuda"])]
            aa = [abs(a - b) for a, b in zip(trace["cuda2"], trace["cuda"])]
            losses[mode] = {"flagos": trace["flagos"], "cuda": trace["cuda"],
                            "max_abs_diff": max(diffs), "aa_max_abs_diff": max(aa)}
    finally:
        for w in worlds:
            w.close()
    seconds = time.monotonic() - t_start

    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "torch": torch_info["torch"], "cuda": torch_info["cuda"], "nccl": torch_info["nccl"],
            "gpu": torch_info["gpu"], "gpus": args.gpus,
            "rounds": args.rounds, "iters": args.iters, "size": args.size, "dtype": args.dtype,
            "batch_per_rank": args.batch, "seq": args.seq, "steps_per_round": args.steps,
            "seconds": round(seconds, 1), "env": GPU_ENV,
            "flagos_routing": "* = cuda" if args.all_cuda else "default",
            "method": "worlds run one at a time, alternating order per round; speed = "
                      "median per-round cuda_time/flagos_time (busbw: flagos/cuda)"}
    print(f"torch {meta['torch']} (CUDA {meta['cuda']}, NCCL {meta['nccl']}), {args.gpus}x "
          f"{meta['gpu']}, {args.rounds} rounds, flagos routing {meta['flagos_routing']}, "
          f"{seconds:.0f} s")
    w = max(len(r["row"]) for r in rows) + 2
    print(f"{'row':<{w}} {'flagos/A':>10} {'cuda':>10} {'unit':>5} {'speed':>6}   per-round")
    for r in rows:
        spread = " ".join(f"{x:.3f}" for x in r["rounds"])
        print(f"{r['row']:<{w}} {r['flagos_or_a']:>10.2f} {r['cuda']:>10.2f} {r['unit']:>5} "
              f"{r['speed']:>6.3f}   {spread}")
    for mode, l in losses.items():
        print(f"{mode} losses (rank 0, {len(l['flagos'])} steps): max |flagos - cuda| = "
              f"{l['max_abs_diff']:.3g} (A/A {l['aa_max_abs_diff']:.3g}); first "
              f"{l['flagos'][0]:.4f}/{l['cuda'][0]:.4f}, last {l['flagos'][-1]:.4f}/"
              f"{l['cuda'][-1]:.4f}")
    print("speed >= 0.95 is the target; A/A rows show the method's noise")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows, "losses": losses}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
