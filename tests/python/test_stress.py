"""Concurrency stress: many threads, each on its own flagos stream, doing real work.

Each worker allocates, copies (cpu -> flagos, flagos -> flagos on one device and
across devices, flagos -> cpu), runs mixed operators (matmul, add, softmax,
indexing, in-place ops, reductions), compares every result with the same
computation on the CPU, and frees everything. The run must end with every
thread joined within its timeout (no deadlock), no wrong value, and the
allocator's byte count back where it started. A second test changes routes
with torch_fl.routing.set_route while the workers run.

The host driver runs kernels inline on the calling thread, so there these
tests exercise the runtime's shared state (allocator pools, stream tables, plan
cache, routing epoch, per-thread current device and stream) under real
contention; on the cuda driver the streams are real asynchronous CUDA streams.
"""

import gc
import threading
import time
import traceback

import pytest
import torch

import torch_fl

THREADS = 8
ITERATIONS = 60
JOIN_TIMEOUT_S = 120

# Operators the routing thread flips between two backends every driver has:
# `cpu` and `native`. On the host driver both run PyTorch's CPU kernels; on the
# cuda driver `native` is CUDA's kernels and `cpu` a copy round trip through the
# CPU's. Results must stay correct whatever the route.
ROUTED_OPS = ["mm", "add.Tensor", "_softmax", "index.Tensor", "sum", "mul_.Tensor", "addmm"]
BACKENDS = ["cpu", "native"]

ON_HOST = torch_fl.driver() == "host"
# Against the CPU reference: the host driver runs the same kernels; CUDA's
# round differently (reduction order, cuBLAS).
TOL = 1e-5 if ON_HOST else 1e-4


def _total_allocated():
    gc.collect()
    if not ON_HOST:
        # cuBLAS keeps a workspace, from the same CUDA allocator, for every
        # (handle, stream) pair it has seen; new streams make new ones. They
        # are the library's cache, not tensors: release them before counting.
        torch.flagos.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
    return sum(torch.flagos.memory_allocated(d) for d in range(torch.flagos.device_count()))


def _assert_close(actual, expected, what):
    assert actual.device.type == "flagos", f"{what}: result on {actual.device}"
    torch.testing.assert_close(actual.cpu(), expected, rtol=TOL, atol=TOL,
                               msg=lambda m: f"{what}: {m}")


def _one_iteration(gen, device, other_device, it):
    """One unit of work; every flagos result is checked against the CPU."""
    n = 8 + (it % 5) * 4  # a few shapes, so cached blocks of several sizes move around
    a_cpu = torch.randn(n, n, generator=gen)
    b_cpu = torch.randn(n, n, generator=gen)
    idx_cpu = torch.randint(0, n, (n // 2,), generator=gen)

    # cpu -> flagos
    a = a_cpu.to(device)
    b = b_cpu.to(device, non_blocking=bool(it % 2))
    idx = idx_cpu.to(device)
    assert a.device == device and b.device == device

    # flagos -> flagos, same device and across devices
    c = a.clone()
    c2 = torch.empty_like(b)
    c2.copy_(b)
    far = a.to(other_device)
    back = far.to(device)
    _assert_close(c, a_cpu, "clone")
    _assert_close(c2, b_cpu, "copy_")
    _assert_close(far, a_cpu, f"copy to {other_device}")
    _assert_close(back, a_cpu, "copy back")

    # mixed operators
    _assert_close(a @ b, a_cpu @ b_cpu, "matmul")
    _assert_close(torch.addmm(a, a, b, beta=0.5), torch.addmm(a_cpu, a_cpu, b_cpu, beta=0.5), "addmm")
    _assert_close(a + b * 2, a_cpu + b_cpu * 2, "add/mul")
    _assert_close(torch.softmax(a, dim=-1), torch.softmax(a_cpu, dim=-1), "softmax")
    _assert_close(a[idx], a_cpu[idx_cpu], "advanced indexing")
    _assert_close(a[1:-1, ::2], a_cpu[1:-1, ::2], "slicing")
    _assert_close(a.index_select(1, idx), a_cpu.index_select(1, idx_cpu), "index_select")
    _assert_close(far.relu() * 3, a_cpu.relu() * 3, f"ops on {other_device}")

    # in-place
    c.mul_(3).add_(b).clamp_(-2, 2)
    ref = (a_cpu * 3 + b_cpu).clamp(-2, 2)
    _assert_close(c, ref, "in-place chain")
    c2[idx] = 0.5
    ref2 = b_cpu.clone()
    ref2[idx_cpu] = 0.5
    _assert_close(c2, ref2, "index_put_")

    # reductions (and a scalar read back)
    _assert_close(a.sum(), a_cpu.sum(), "sum")
    _assert_close(b.mean(dim=0), b_cpu.mean(dim=0), "mean")
    _assert_close(torch.amax(a, dim=1), torch.amax(a_cpu, dim=1), "amax")
    _assert_close(a.argmax(dim=1), a_cpu.argmax(dim=1), "argmax")
    assert abs(float(c.norm()) - float(ref.norm())) < 1e-3, "norm"

    # flagos -> cpu, then explicit frees
    out = (a @ b).softmax(-1).cpu()
    torch.testing.assert_close(out, (a_cpu @ b_cpu).softmax(-1), rtol=TOL, atol=TOL)
    del a, b, c, c2, far, back, idx


def _worker(tid, iterations, errors, done):
    try:
        gen = torch.Generator().manual_seed(1000 + tid)
        n_dev = torch.flagos.device_count()
        device = torch.device("flagos", tid % n_dev)
        other = torch.device("flagos", (tid + 1) % n_dev)
        torch.flagos.set_device(device)
        stream = torch.flagos.Stream()
        assert stream.device == device
        with torch.flagos.stream(stream):
            assert torch.flagos.current_stream() == stream
            for it in range(iterations):
                _one_iteration(gen, device, other, it)
            torch.flagos.current_stream().synchronize()
        assert torch.flagos.current_stream(device) == torch.flagos.default_stream(device)
    except BaseException:  # noqa: BLE001  (reported by the main thread)
        errors.append(f"thread {tid}:\n{traceback.format_exc()}")
    finally:
        done[tid] = True


def _run_workers(iterations, extra=None):
    errors, done = [], [False] * THREADS
    threads = [threading.Thread(target=_worker, args=(t, iterations, errors, done),
                                name=f"flagos-stress-{t}", daemon=True)
               for t in range(THREADS)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {JOIN_TIMEOUT_S}s (deadlock?): {hung}"
    assert all(done)
    assert not errors, "\n".join(errors)


@pytest.fixture
def settled_memory():
    """The allocated byte count before the test, with every garbage tensor gone."""
    gc.collect()
    start = _total_allocated()
    yield start
    gc.collect()


def test_threads_on_their_own_streams_compute_correctly_and_free_everything(settled_memory):
    _run_workers(ITERATIONS)
    gc.collect()
    assert _total_allocated() == settled_memory
    torch.flagos.synchronize()


def test_routes_change_while_threads_run_ops(settled_memory):
    torch_fl.routing.reset_stats()
    stop = threading.Event()
    router_errors = []
    switches = [0]

    def router():
        try:
            i = 0
            while not stop.is_set():
                op = ROUTED_OPS[i % len(ROUTED_OPS)]
                torch_fl.routing.set_route(op, BACKENDS[(i // len(ROUTED_OPS)) % 2])
                if i % 5 == 0:
                    torch_fl.routing.table()  # reads the table while it changes
                    torch_fl.routing.stats()
                i += 1
                switches[0] = i
                time.sleep(0.0005)
        except BaseException:  # noqa: BLE001
            router_errors.append(traceback.format_exc())

    rt = threading.Thread(target=router, name="flagos-router", daemon=True)
    rt.start()
    try:
        _run_workers(ITERATIONS // 2)
    finally:
        stop.set()
        rt.join(timeout=30)
        for op in ROUTED_OPS:
            torch_fl.routing.set_route(op, "")
    assert not rt.is_alive(), "routing thread did not stop"
    assert not router_errors, router_errors[0]
    assert switches[0] > len(ROUTED_OPS) * 2, f"only {switches[0]} route changes happened"
    # Both backends really served the routed operators during the run.
    calls = {s.op: s.calls for s in torch_fl.routing.stats()}
    mm = calls.get("aten::mm", {})
    assert mm.get("cpu", 0) > 0 and mm.get("native", 0) > 0, calls.get("aten::mm")
    gc.collect()
    assert _total_allocated() == settled_memory
    # The overrides are gone: no route comes from the API any more.
    x = torch.ones(2, 2, device="flagos")
    (x @ x).cpu()
    assert all(r.source != "api" for r in torch_fl.routing.table()), torch_fl.routing.table()
