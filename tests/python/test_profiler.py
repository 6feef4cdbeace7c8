"""The autograd profiler with `use_device="flagos"`: every operator is timed on
the device through flagos' profiler stubs (csrc/profiler/legacy_stubs.cpp).
Both drivers; torch.profiler's Kineto path on the GPU is tested in
test_cuda_driver.py."""

import json

import torch
from torch.autograd.profiler import profile, record_function


def _no_callback_errors(capfd):
    err = capfd.readouterr().err
    assert "Exception in RecordFunction callback" not in err, err[-2000:]
    assert "not enabled" not in err, err[-2000:]


def test_use_device_flagos_times_every_operator_on_the_device(capfd):
    g = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(64, 32, generator=g), torch.randn(32, 16, generator=g)
    with profile(use_device="flagos") as prof:
        a, b = a_cpu.to("flagos"), b_cpu.to("flagos")
        with record_function("matmul_block"):
            y = torch.relu(a @ b) + 1.0
        out = y.cpu()
    _no_callback_errors(capfd)
    torch.testing.assert_close(out, torch.relu(a_cpu @ b_cpu) + 1.0, rtol=1e-5, atol=1e-5)

    events = prof.function_events
    names = {e.name for e in events}
    assert {"aten::mm", "aten::relu", "aten::add", "matmul_block"} <= names, names
    for e in events:
        assert e.cpu_time_total >= 0, (e.name, e.cpu_time_total)
        assert e.device_time_total >= 0, (e.name, e.device_time_total)
    # The device span of the block holds its operators' device spans.
    block = next(e for e in events if e.name == "matmul_block")
    mm = next(e for e in events if e.name == "aten::mm")
    assert block.device_time_total >= mm.device_time_total > 0
    table = prof.key_averages().table(sort_by="cpu_time_total")
    assert "aten::mm" in table and "FLAGOS" in table.upper()


def test_use_device_flagos_profiles_backward_and_streams(capfd, tmp_path):
    w = torch.randn(16, 16, device="flagos", requires_grad=True)
    x = torch.randn(8, 16, device="flagos")
    stream = torch.Stream(device="flagos")
    with profile(use_device="flagos", record_shapes=True) as prof:
        (x @ w).square().sum().backward()
        with stream:
            z = x * 2
        stream.synchronize()
    _no_callback_errors(capfd)
    torch.testing.assert_close(z.cpu(), x.cpu() * 2)
    names = [e.name for e in prof.function_events]
    assert any("Backward" in n for n in names), names
    assert all(e.device_time_total >= 0 for e in prof.function_events)
    # The trace exports as valid JSON with the operators in it.
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert any(ev.get("name") == "aten::mul" for ev in trace["traceEvents"])


def test_profiling_twice_in_a_row_keeps_working(capfd):
    for _ in range(2):
        with profile(use_device="flagos") as prof:
            t = torch.ones(4, device="flagos").add_(1)
        assert t.sum().item() == 8
        assert any(e.name == "aten::add_" for e in prof.function_events)
    _no_callback_errors(capfd)


def test_profile_memory_counts_flagos_allocations(tmp_path):
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as kineto_profile

    acts = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    with kineto_profile(activities=acts, profile_memory=True) as prof:
        a = torch.randn(256, 256, device="flagos")
        b = a @ a
        del a, b
    events = {e.key: e for e in prof.key_averages()}
    nbytes = 256 * 256 * 4
    # Device memory, not host memory, for both operators' results.
    for op in ("aten::randn", "aten::mm"):
        assert events[op].device_memory_usage == nbytes, (op, events[op].device_memory_usage)
        assert events[op].cpu_memory_usage == 0, (op, events[op].cpu_memory_usage)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    memory = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    sizes = sorted(e["args"]["Bytes"] for e in memory)
    assert sizes.count(nbytes) >= 2 and sizes.count(-nbytes) >= 2, sizes
