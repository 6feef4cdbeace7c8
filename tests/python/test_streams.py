"""Streams and events on flagos devices."""

import time

import pytest
import torch
import torch_fl

DEV1 = torch.device("flagos", 1)
two_devices = pytest.mark.skipif(torch.flagos.device_count() < 2, reason="needs two flagos devices")


@pytest.fixture(autouse=True)
def restore_streams_and_device():
    device = torch.flagos.current_device()
    streams = [torch.flagos.current_stream(i) for i in range(torch.flagos.device_count())]
    yield
    for s in streams:
        torch.flagos.set_stream(s)
    torch.flagos.set_device(device)


def timing_event():
    return torch.Event(device="flagos", enable_timing=True)


# ---------------------------------------------------------------- streams


def test_stream_creation():
    s = torch.flagos.Stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("flagos", 0)
    assert s != torch.flagos.default_stream()
    assert s.query() is True
    s.synchronize()


def test_streams_are_distinct():
    a, b = torch.flagos.Stream(), torch.flagos.Stream()
    assert a != b
    assert a.stream_id != b.stream_id


def test_high_priority_stream():
    s = torch.flagos.Stream(priority=-1)
    assert s.device.type == "flagos"
    assert s != torch.flagos.default_stream()
    with torch.flagos.stream(s):
        assert torch.flagos.current_stream() == s
        x = torch.randn(10, device="flagos")
        y = (x * 3).cpu()
    torch.testing.assert_close(y, x.cpu() * 3)


def test_current_stream_is_default_stream_initially():
    assert torch.flagos.current_stream() == torch.flagos.default_stream()
    assert torch.flagos.default_stream().stream_id == 0
    assert torch.accelerator.current_stream() == torch.flagos.current_stream()


def test_stream_context_sets_and_restores_current_stream():
    s = torch.flagos.Stream()
    before = torch.flagos.current_stream()
    with torch.flagos.stream(s):
        assert torch.flagos.current_stream() == s
        assert torch.accelerator.current_stream() == s
        inner = torch.flagos.Stream()
        with torch.flagos.stream(inner):
            assert torch.flagos.current_stream() == inner
        assert torch.flagos.current_stream() == s
    assert torch.flagos.current_stream() == before


def test_stream_context_restores_after_exception():
    s = torch.flagos.Stream()
    with pytest.raises(KeyError):
        with torch.flagos.stream(s):
            raise KeyError("boom")
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_stream_context_with_none_is_a_no_op():
    before = torch.flagos.current_stream()
    with torch.flagos.stream(None):
        assert torch.flagos.current_stream() == before


def test_stream_context_rejects_non_flagos_stream():
    with pytest.raises(ValueError, match="flagos"):
        with torch.flagos.stream(torch.Stream(device="cpu")):
            pass


def test_set_stream():
    s = torch.flagos.Stream()
    torch.flagos.set_stream(s)
    assert torch.flagos.current_stream() == s
    torch.flagos.set_stream(torch.flagos.default_stream())
    assert torch.flagos.current_stream() == torch.flagos.default_stream()


def test_ops_on_a_side_stream_are_correct():
    a_cpu = torch.randn(32, 32)
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        a = a_cpu.to("flagos")
        b = a @ a + 1
    s.synchronize()
    torch.testing.assert_close(b.cpu(), a_cpu @ a_cpu + 1, rtol=1e-4, atol=1e-4)


@two_devices
def test_streams_per_device():
    s1 = torch.flagos.Stream(device=1)
    assert s1.device == DEV1
    assert torch.flagos.default_stream(1).device == DEV1
    assert torch.flagos.current_stream(1) == torch.flagos.default_stream(1)
    assert torch.flagos.current_device() == 0
    with torch.flagos.stream(s1):
        # like torch.cuda.stream: the stream's device becomes current
        assert torch.flagos.current_device() == 1
        assert torch.flagos.current_stream(1) == s1
        assert torch.flagos.current_stream(0) == torch.flagos.default_stream(0)
        t = torch.randn(4, device="flagos")
        assert t.device == DEV1
    assert torch.flagos.current_device() == 0
    assert torch.flagos.current_stream(1) == torch.flagos.default_stream(1)


@two_devices
def test_current_stream_is_per_device():
    s0 = torch.flagos.Stream(device=0)
    s1 = torch.flagos.Stream(device=1)
    torch.flagos.set_stream(s1)
    torch.flagos.set_device(0)
    torch.flagos.set_stream(s0)
    assert torch.flagos.current_stream(0) == s0
    assert torch.flagos.current_stream(1) == s1


def test_stream_wait_event_orders_work_across_streams():
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    x_cpu = torch.randn(64, 64)
    with torch.flagos.stream(s1):
        x = x_cpu.to("flagos", non_blocking=True)
        y = x @ x.t()
        done = s1.record_event()
    with torch.flagos.stream(s2):
        s2.wait_event(done)
        z = (y * 2).cpu()
    torch.testing.assert_close(z, (x_cpu @ x_cpu.t()) * 2, rtol=1e-4, atol=1e-4)


def test_stream_wait_stream_orders_work_across_streams():
    s1, s2 = torch.flagos.Stream(), torch.flagos.Stream()
    src = torch.randn(1000)
    with torch.flagos.stream(s1):
        x = src.to("flagos")
        x.mul_(3).add_(1)
    s2.wait_stream(s1)
    with torch.flagos.stream(s2):
        y = x.sum()
    s2.synchronize()
    assert y.item() == pytest.approx((src * 3 + 1).sum().item(), rel=1e-4, abs=1e-3)


def test_record_stream_defers_reuse_and_frees():
    s = torch.flagos.Stream()
    base_blocks = torch.flagos.memory_stats()["allocation.all.current"]
    x = torch.randn(10_000, device="flagos")
    with torch.flagos.stream(s):
        y = x * 2
    x.record_stream(s)
    del x
    assert torch.flagos.memory_stats()["allocation.all.current"] == base_blocks + 1  # y
    torch.flagos.synchronize()
    z = torch.randn(10_000, device="flagos")  # allocation still works afterwards
    del y, z
    assert torch.flagos.memory_stats()["allocation.all.current"] == base_blocks


def test_cached_block_is_not_reused_across_streams():
    torch.flagos.empty_cache()
    a = torch.empty(123_456, dtype=torch.uint8, device="flagos")
    ptr = a.data_ptr()
    del a
    s = torch.flagos.Stream()
    with torch.flagos.stream(s):
        b = torch.empty(123_456, dtype=torch.uint8, device="flagos")
    assert b.data_ptr() != ptr
    c = torch.empty(123_456, dtype=torch.uint8, device="flagos")
    assert c.data_ptr() == ptr


# ---------------------------------------------------------------- events


def test_event_record_synchronize_query():
    e = torch.flagos.Event()
    assert e.query() is True  # never recorded: nothing pending
    x = torch.randn(128, 128, device="flagos")
    x @ x
    e.record()
    e.synchronize()
    assert e.query() is True
    s = torch.flagos.Stream()
    e2 = s.record_event()
    e2.wait(torch.flagos.current_stream())
    assert e2.query() is True


def test_flagos_event_elapsed_time_measures_sleep():
    start = torch.flagos.Event(enable_timing=True)
    end = torch.flagos.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    assert 40.0 <= ms < 2000.0


def test_event_elapsed_time_measures_sleep():
    start, end = timing_event(), timing_event()
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    # host driver: work (and the sleep) runs inline; cuda driver: an idle stream
    # records each event as it is submitted
    assert 40.0 <= ms < 2000.0


def test_event_elapsed_time_is_non_negative_for_back_to_back_records():
    s = torch.flagos.Stream()
    start, end = timing_event(), timing_event()
    start.record(s)
    end.record(s)
    end.synchronize()
    assert start.elapsed_time(end) >= 0.0


def test_elapsed_time_without_timing_raises_clear_error():
    a, b = torch.Event(device="flagos"), torch.Event(device="flagos")
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_before_recording_raises_clear_error():
    a, b = timing_event(), timing_event()
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)


def test_event_on_device_1_stream():
    s1 = torch.flagos.Stream(device=1)
    e = torch.Event(device="flagos:1", enable_timing=True)
    e.record(s1)
    assert e.device.index == 1
    e.synchronize()
    # an event recorded on device 1 cannot then be recorded on device 0
    # (the cuda driver forwards to PyTorch's CUDA guard, which words it so)
    with pytest.raises(RuntimeError, match="flagos:1.*flagos:0|device index 1.*device index 0"):
        e.record(torch.flagos.default_stream(0))


def test_stream_priority_and_its_range_as_torch_cuda_gives_them():
    least, greatest = torch.flagos.Stream.priority_range()
    assert greatest < least  # lower is higher, CUDA's order
    if torch_fl.driver() == "cuda":  # the streams are CUDA's
        assert (least, greatest) == torch.cuda.Stream.priority_range()
    assert torch.flagos.default_stream().priority == least
    assert torch.flagos.Stream().priority == least
    high = torch.flagos.Stream(priority=greatest)
    assert high.priority == greatest
    assert torch.flagos.Stream(priority=greatest - 7).priority == greatest  # clamped, as CUDA does
    with torch.flagos.stream(high):
        current = torch.flagos.current_stream()
        assert isinstance(current, torch.flagos.Stream) and current == high
        assert current.priority == greatest


RECORD_STREAM_CHILD = r"""
import torch, torch_fl
s0 = torch.flagos.Stream(0)
x1 = torch.randn(1024, device="flagos:1")
with torch.flagos.stream(s0):
    y0 = x1.to("flagos:0", non_blocking=True)
x1.record_stream(s0)   # the destination's stream: another device than the block's
want = x1.cpu()
del x1                 # the block waits for s0's work: an event of flagos:0
torch.flagos.synchronize(0)
assert torch.equal(y0.cpu(), want)
# the freed block is reused once s0's work is done
z = torch.randn(1024, device="flagos:1")
print("ok")
"""


def test_record_stream_on_another_devices_stream_then_free(run_py):
    # CUDA's pattern for cross-device copies. The freed block's event was made
    # on the block's device and recorded on the other device's stream: the
    # deleter threw, and the process ended.
    rc, out, err = run_py(RECORD_STREAM_CHILD, env={"FLAGOS_HOST_DEVICES": "2"})
    assert rc == 0 and out.strip().endswith("ok"), err[-3000:]


@pytest.mark.host_only  # the cuda driver hands record_stream to CUDA's allocator
@pytest.mark.parametrize("stream, error, words", [
    ("torch.Stream(stream_id=12345, device_index=0, device_type=DT)", RuntimeError,
     "unknown flagos stream id 12345"),
    ("torch.Stream(stream_id=0, device_index=5, device_type=DT)", RuntimeError,
     "flagos device index 5 does not exist"),
    ("torch.Stream('cpu')", ValueError, "not on a cpu stream"),
])
def test_record_stream_refuses_a_stream_that_is_not_a_flagos_stream(stream, error, words):
    # Accepted, then the process ended when the tensor was freed (an unknown
    # stream), or silently ignored (a CPU stream); CUDA refuses both at once.
    DT = torch.flagos.current_stream().device_type  # noqa: N806 (used by eval)
    x = torch.ones(3, device="flagos")
    with pytest.raises(error, match=words):
        x.record_stream(eval(stream))
    del x  # freed without a stream to wait for


@pytest.mark.host_only  # CUDA's own pinned-memory allocator on the cuda driver
@pytest.mark.skipif(tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 13),
                    reason="torch_fl registers the host allocator from torch 2.13 (version.h)")
def test_accelerator_host_cache_and_statistics(run_py):
    # torch.accelerator.empty_host_cache() read PrivateUse1's host allocator,
    # which was not registered: a segfault once flagos had been used.
    code = r'''
import torch, torch_fl
torch.zeros(1, device="flagos")
x = torch.ones(1000).pin_memory()
torch.accelerator.empty_host_cache()
print(x.is_pinned(), float(x.sum()))
'''
    rc, out, err = run_py(code)
    assert rc == 0, err[-3000:]
    assert out.strip().splitlines()[-1] == "True 1000.0"


def test_elapsed_time_refuses_events_of_two_devices():
    # CUDA refuses it; the host driver returned the time between the two.
    a = torch.flagos.Event(enable_timing=True)
    b = torch.flagos.Event(enable_timing=True)
    a.record(torch.flagos.current_stream(0))
    b.record(torch.flagos.current_stream(torch.device("flagos:1")))
    with pytest.raises(RuntimeError):
        a.elapsed_time(b)


def test_streams_made_in_a_loop_never_run_out():
    # torch.cuda.Stream() takes the next stream of CUDA's pool; flagos made a
    # new stream each time, and refused the 4,032nd.
    streams = [torch.flagos.Stream() for _ in range(5000)]
    assert len({s.stream_id for s in streams[:32]}) == 32  # round robin: distinct neighbours
    with torch.flagos.stream(streams[-1]):
        x = torch.ones(3, device="flagos") * 2
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]
    assert all(s.priority == 0 for s in streams[:40])
    high = [torch.flagos.Stream(priority=-1) for _ in range(40)]
    assert all(s.priority == -1 for s in high)
