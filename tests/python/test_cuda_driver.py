"""The cuda driver: flagos on NVIDIA GPUs, with PyTorch's CUDA memory, streams,
events and generators, and PyTorch's CUDA kernels over zero-copy views.

Marked `cuda`: skipped unless torch_fl selected the cuda driver.
"""

import threading

import pytest
import torch
import torch.nn.functional as F

import torch_fl

pytestmark = pytest.mark.cuda


@pytest.fixture
def cuda_kernels():
    """Every operator on PyTorch's CUDA kernels (`* = cuda`), whether or not
    FlagGems is on: these tests compare flagos with native CUDA bit for bit."""
    torch_fl.routing.set_route("*", "cuda")
    yield
    torch_fl.routing.set_route("*", "")


def fresh(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype)


def close(flagos_result, reference, **kw):
    torch.testing.assert_close(flagos_result.cpu(), reference.cpu(), **kw)


def test_devices_are_cuda_ordinals():
    assert torch_fl.driver() == "cuda"
    assert torch.flagos.device_count() == torch.cuda.device_count()
    for i in range(torch.flagos.device_count()):
        with torch.flagos.device(i):
            assert torch.cuda.current_device() == i
            x = torch.empty(4, device="flagos")
            assert x.device == torch.device("flagos", i)
            assert torch.flagos.current_device() == i
    assert torch.accelerator.current_accelerator().type == "flagos"


def test_memory_is_one_pool_with_torch_cuda():
    torch.flagos.synchronize()
    before_cuda = torch.cuda.memory_allocated()
    before = torch.flagos.memory_allocated()
    assert before == before_cuda
    x = torch.empty(1 << 20, device="flagos")  # 4 MiB
    assert torch.cuda.memory_allocated() - before_cuda >= 4 << 20
    assert torch.flagos.memory_allocated() == torch.cuda.memory_allocated()
    y = x + 1  # a CUDA kernel's output is flagos memory in the same pool
    assert torch.flagos.memory_allocated() >= before + (8 << 20)
    del x, y
    assert torch.flagos.memory_allocated() == before
    stats = torch.flagos.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.cuda.memory_stats()["allocated_bytes.all.current"]


def test_out_of_memory_is_torch_out_of_memory_error_and_device_survives():
    free, total = torch.flagos.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(total * 2, dtype=torch.uint8, device="flagos")
    x = torch.ones(1000, device="flagos")
    assert x.sum().item() == 1000


def test_streams_are_cuda_streams():
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        assert torch.flagos.current_stream().stream_id == torch.cuda.current_stream().stream_id
    cs = torch.cuda.Stream()
    with torch.cuda.stream(cs):
        assert torch.flagos.current_stream().stream_id == cs.stream_id
    assert torch.flagos.current_stream().stream_id == torch.cuda.current_stream().stream_id


def test_stream_ordering_with_events_and_non_blocking_copies():
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    host = fresh(1 << 20).pin_memory()
    assert host.is_pinned()
    with torch.flagos.stream(s1):
        dev = host.to("flagos", non_blocking=True)
        big = fresh(2048, 2048).to("flagos", non_blocking=True)
        for _ in range(10):
            big = big @ big / 2048  # keep s1 busy
        dev = dev * 2
        ev = torch.flagos.Event()
        ev.record(s1)
    s2.wait_event(ev)
    with torch.flagos.stream(s2):
        out = dev + 1
        back = torch.empty(out.shape, pin_memory=True)
        back.copy_(out, non_blocking=True)
    s2.synchronize()
    torch.testing.assert_close(back, host * 2 + 1)


def test_events_time_gpu_work():
    a, b = torch.flagos.Event(enable_timing=True), torch.flagos.Event(enable_timing=True)
    x = fresh(2048, 2048).to("flagos")
    a.record()
    for _ in range(20):
        x = x @ x / 2048
    b.record()
    b.synchronize()
    ms = a.elapsed_time(b)
    assert 0 < ms < 10_000


def test_profiler_records_kernels_of_flagos_operators(cuda_kernels):
    """torch.profiler with CUDA activity sees the kernels flagos launches, with
    their device time. With a PrivateUse1 backend registered, Kineto reports
    GPU activity under that device type (the `flagos` columns), not CUDA's."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = fresh(512, 512).to("flagos")
    torch.flagos.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        y = x @ x
        torch.flagos.synchronize()
    close(y, x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)
    gpu = [e for e in prof.events() if e.device_type in (DeviceType.CUDA, DeviceType.PrivateUse1)]
    assert gpu, "no GPU activity recorded"
    assert {e.device_type for e in gpu} == {DeviceType.PrivateUse1}
    assert sum(e.time_range.elapsed_us() for e in gpu) > 0
    mm = [e for e in prof.key_averages() if e.key == "aten::mm"]
    assert mm and mm[0].device_time_total > 0


def test_seeded_randomness_equals_cuda(cuda_kernels):
    for fn in (lambda d: torch.randn(1000, device=d),
               lambda d: torch.rand(37, 5, device=d),
               lambda d: torch.randint(0, 100, (64,), device=d),
               lambda d: F.dropout(torch.ones(512, device=d), 0.3)):
        torch.manual_seed(1234)
        ref = fn("cuda")
        torch.manual_seed(1234)
        got = fn("flagos")
        assert torch.equal(got.cpu(), ref.cpu())
    torch.flagos.manual_seed(7)
    state = torch.flagos.get_rng_state()
    a = torch.randn(16, device="flagos")
    torch.flagos.set_rng_state(state)
    b = torch.randn(16, device="flagos")
    assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_native_route_matches_cuda(dtype, cuda_kernels):
    a, b = fresh(64, 96, dtype=dtype), fresh(96, 32, dtype=dtype)
    for fn in (lambda x, y: x @ y,
               lambda x, y: F.softmax(x @ y, -1),
               lambda x, y: F.layer_norm(x, (96,)),
               lambda x, y: torch.cat([x, x * 2], 0).sum(0),
               lambda x, y: x[:, ::2].contiguous().add_(1).mean(1),
               lambda x, y: torch.index_select(x, 0, torch.arange(0, 64, 3, device=x.device))):
        ref = fn(a.cuda(), b.cuda())
        got = fn(a.to("flagos"), b.to("flagos"))
        assert got.device.type == "flagos"
        close(got, ref, rtol=0, atol=0)  # the same kernels: bit for bit


def test_native_route_never_relabels_caller_tensors():
    x = fresh(8, 8).to("flagos")
    y = x.t()
    z = y @ x
    assert x.device.type == "flagos" and y.device.type == "flagos" and z.device.type == "flagos"
    assert y.storage().data_ptr() == x.storage().data_ptr()
    y.mul_(2)  # in-place through a view is visible in the base
    close(x, (y.t()))


REFERENCE_TRAINING = """
import copy, sys, torch, torch.nn.functional as F
dev = sys.argv[1]
if dev == "flagos":
    import torch_fl  # noqa: F401
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dev)
g = torch.Generator().manual_seed(1)
data, target = torch.randn(16, 32, generator=g), torch.randint(0, 8, (16,), generator=g)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(3):
    opt.zero_grad()
    loss = F.cross_entropy(model(data.to(dev)), target.to(dev))
    loss.backward()
    opt.step()
torch.save([loss.detach().cpu()] + [p.detach().cpu() for p in model.parameters()], sys.argv[2])
"""


def test_autograd_and_optimizer_match_cuda(tmp_path):
    # The CUDA reference runs in a process without torch_fl: once a PrivateUse1
    # backend is registered, PyTorch's autograd engine refuses CUDA backward
    # (at::getAccelerator() prefers PrivateUse1; pytorch/pytorch#161129).
    import subprocess
    import sys
    results = {}
    for dev in ("cuda", "flagos"):
        path = tmp_path / f"{dev}.pt"
        env = dict(__import__("os").environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0" if dev == "cuda" else "1")
        subprocess.run([sys.executable, "-c", REFERENCE_TRAINING, dev, str(path)], check=True, env=env)
        results[dev] = torch.load(path)
    for got, ref in zip(results["flagos"], results["cuda"]):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_autocast_bf16_on_flagos():
    lin = torch.nn.Linear(16, 16).to("flagos")
    with torch.autocast("flagos", dtype=torch.bfloat16):
        out = lin(fresh(4, 16).to("flagos"))
    assert out.dtype == torch.bfloat16


def test_threads_on_their_own_streams_get_correct_results():
    errors = []

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(256, 256, generator=g)
        b = torch.randn(256, 256, generator=g)
        ref = (a.double() @ b.double()).relu().sum(0)
        s = torch.flagos.Stream()
        try:
            with torch.flagos.stream(s):
                for _ in range(50):
                    got = (a.to("flagos", non_blocking=True) @ b.to("flagos")).relu().sum(0).cpu()
                    torch.testing.assert_close(got.double(), ref, rtol=1e-3, atol=1e-2)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors[0]


def test_routing_on_cuda_driver():
    assert set(torch_fl.routing.available_backends()) >= {"cuda", "native", "cpu"}
    x = fresh(5).to("flagos")
    torch.neg(x)
    rows = {r.op: r for r in torch_fl.routing.table("neg") if r.resolved}
    assert rows["aten::neg"].backend == (
        "flaggems" if "neg" in torch_fl.flaggems.registered_ops() else "native")
    torch_fl.routing.set_route("neg", "cuda")
    try:
        close(torch.neg(x), -x.cpu())
        assert {r.op: r for r in torch_fl.routing.table("neg") if r.resolved}["aten::neg"].backend == "cuda"
    finally:
        torch_fl.routing.set_route("neg", "")


def test_cpu_route_is_a_copy_round_trip_with_in_place_semantics():
    x_cpu = fresh(6, 4)
    x = x_cpu.to("flagos")
    torch_fl.routing.set_route("mul", "cpu")
    torch_fl.routing.set_route("add", "cpu")
    try:
        y = x * 3
        assert y.device.type == "flagos"
        close(y, x_cpu * 3)
        x.add_(1)  # written argument comes back to the flagos tensor
        close(x, x_cpu + 1)
        out = torch.empty(0, device="flagos")
        torch.mul(x, 2, out=out)  # out= resized on the way back
        close(out, (x_cpu + 1) * 2)
        stats = {s.op: s for s in torch_fl.routing.stats()}
        assert stats["aten::mul.Tensor"].calls.get("cpu", 0) >= 1
    finally:
        torch_fl.routing.set_route("mul", "")
        torch_fl.routing.set_route("add", "")


def test_save_load_round_trip(tmp_path):
    x = fresh(3, 4).to("flagos")
    torch.save({"x": x}, tmp_path / "t.pt")
    y = torch.load(tmp_path / "t.pt")["x"]
    assert y.device.type == "flagos"
    close(y, x)
    z = torch.load(tmp_path / "t.pt", map_location="cpu")["x"]
    close(z, x)
