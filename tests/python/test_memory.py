"""The flagos caching allocator: statistics, caching, OOM, pinned host memory."""

import contextlib
import gc
import re

import pytest
import torch
import torch_fl

MiB = 1 << 20

# The OOM child process starts with the first test of this module and runs
# alongside the in-process tests.
pytestmark = pytest.mark.usefixtures("oom_run")


def allocated(device=None):
    return torch.flagos.memory_allocated(device)


@contextlib.contextmanager
def machine_memory(nbytes):
    """The host driver reads `nbytes` as the machine's available memory, inside."""
    torch_fl._C._override_available_memory(nbytes)
    try:
        yield
    finally:
        torch_fl._C._override_available_memory(-1)


def nbytes(t):
    return t.numel() * t.element_size()


@pytest.fixture(autouse=True)
def fresh_cache():
    """Each test starts with no cached blocks, so that its byte counts are exact."""
    torch.flagos.empty_cache()
    yield


def live_blocks(device=None):
    return torch.flagos.memory_stats(device)["allocation.all.current"]


# ---------------------------------------------------------------- subprocesses

OOM_SNIPPET = r"""
import torch, torch_fl
MiB = 1 << 20
assert torch.flagos.mem_get_info()[1] == 64 * MiB, torch.flagos.mem_get_info()


def expect_oom(label, make, why):  # prints the first line of make()'s OutOfMemoryError
    try:
        make()
    except torch.OutOfMemoryError as e:
        print(label + ":", str(e).splitlines()[0])
    else:
        raise SystemExit(why + " did not raise")


# 1. a plain allocation larger than the device
expect_oom("OOM1", lambda: torch.empty(128 * MiB, dtype=torch.uint8, device="flagos"),
           "128 MiB on a 64 MiB device")
assert torch.flagos.memory_stats()["num_ooms"] >= 1

# 2. the device still works afterwards
x = torch.randn(1000, device="flagos")
y = (x * 2 + 1).cpu()
torch.testing.assert_close(y, x.cpu() * 2 + 1)
del x, y
big = torch.empty(32 * MiB, dtype=torch.uint8, device="flagos")
big.fill_(3)
assert int(big[-1]) == 3
del big
print("RECOVERED")

# 3. an op whose *result* does not fit raises OOM too, not a crash
x = torch.ones(40 * MiB // 4, device="flagos")
expect_oom("OOM2", lambda: x + 1, "a 40 MiB result next to a 40 MiB input in 64 MiB")
assert float(x[0]) == 1.0
del x
torch.flagos.empty_cache()

# 4. cached blocks are released and the allocation retried before OOM
a = torch.empty(40 * MiB, dtype=torch.uint8, device="flagos")
del a  # cached, still reserved
assert torch.flagos.memory_reserved() >= 40 * MiB
before = torch.flagos.memory_stats()["num_alloc_retries"]
b = torch.empty(50 * MiB, dtype=torch.uint8, device="flagos")
assert torch.flagos.memory_stats()["num_alloc_retries"] == before + 1
del b
print("RETRIED")

# 5. each device has its own capacity
c0 = torch.empty(48 * MiB, dtype=torch.uint8, device="flagos:0")
c1 = torch.empty(48 * MiB, dtype=torch.uint8, device="flagos:1")
print("PER_DEVICE_OK")
del c0, c1
torch.flagos.empty_cache()

# 6. a per-process memory fraction caps one device's reserved bytes, cache included
torch.flagos.set_per_process_memory_fraction(0.25, "flagos:1")  # 16 MiB of 64
assert torch.flagos.get_per_process_memory_fraction(1) == 0.25
assert torch.flagos.get_per_process_memory_fraction(0) == 1.0
a = torch.empty(10 * MiB, dtype=torch.uint8, device="flagos:1")
expect_oom("OOM3", lambda: torch.empty(10 * MiB, dtype=torch.uint8, device="flagos:1"),
           "20 MiB under a 16 MiB fraction")
assert int(a.fill_(7)[-1]) == 7
del a  # cached: 10 MiB still reserved, released to make room below
b = torch.empty(12 * MiB, dtype=torch.uint8, device="flagos:1")
assert torch.flagos.memory_reserved(1) == 12 * MiB
del b
d0 = torch.empty(40 * MiB, dtype=torch.uint8, device="flagos:0")  # device 0 has no cap
del d0
torch.flagos.set_per_process_memory_fraction(1.0, 1)
e1 = torch.empty(40 * MiB, dtype=torch.uint8, device="flagos:1")
del e1
print("FRACTION_OK")

# 7. a library that retries with a smaller batch on OOM recognises flagos' (accelerate
# matches the words of CUDA's message)
try:
    from accelerate.utils.memory import find_executable_batch_size
except ImportError:
    print("BATCH_SKIPPED")
else:
    @find_executable_batch_size(starting_batch_size=256)
    def fit(batch):
        return torch.empty(batch * MiB, dtype=torch.uint8, device="flagos:0").numel() // MiB
    print("BATCH", fit())
"""


@pytest.fixture(scope="module")
def oom_run(start_py):
    # The host driver with two devices whatever this process runs on (one
    # device, or the cuda driver): the capacity is a host-driver setting.
    proc = start_py(OOM_SNIPPET, env={"FLAGOS_HOST_MEMORY_LIMIT": "64MiB",
                                      "FLAGOS_HOST_DEVICES": "2",
                                      "FLAGOS_ACCELERATOR": "host"})
    return proc


# ---------------------------------------------------------------- statistics


def test_memory_allocated_grows_and_falls_back():
    base = allocated()
    t = torch.empty(256 * 1024, device="flagos")  # 1 MiB
    grown = allocated() - base
    assert grown >= nbytes(t)
    assert grown < nbytes(t) + 64 * 1024  # rounding, not waste
    del t
    assert allocated() == base


def test_memory_allocated_counts_per_device():
    base0, base1 = allocated(0), allocated(1)
    t = torch.randn(1000, device="flagos:1")
    assert allocated(1) - base1 >= nbytes(t)
    assert allocated(0) == base0
    assert allocated("flagos:1") == allocated(1)
    del t
    assert allocated(1) == base1


def test_op_results_are_counted_as_flagos_memory():
    x = torch.randn(512, 512, device="flagos")
    # Warm up first: a driver's libraries may keep memory from their first call
    # (cuBLAS keeps a workspace per stream on the cuda driver).
    x @ x
    torch.sort(x, dim=1)
    base = allocated()
    y = x + 1
    assert allocated() - base >= nbytes(y)
    z = x @ x
    assert allocated() - base >= nbytes(y) + nbytes(z)
    s = torch.sort(x, dim=1)
    assert allocated() - base >= nbytes(y) + nbytes(z) + nbytes(s.values) + nbytes(s.indices)
    del y, z, s
    assert allocated() == base


def test_resized_out_tensor_memory_is_tracked():
    x = torch.randn(1000, device="flagos")
    base = allocated()
    out = torch.empty(0, device="flagos")
    torch.mul(x, 2.0, out=out)
    assert allocated() - base >= nbytes(out)
    del out
    assert allocated() == base


def test_repeated_work_does_not_leak():
    x = torch.randn(64, 64, device="flagos")
    mask = x > 0

    def work():
        y = x @ x.t()
        out = torch.empty(0, device="flagos")
        torch.add(y, 1, out=out)
        z = x[mask].sum() + x.sort(0).values.cumsum(1)[3, 4]
        w = x.clone()
        w[mask] = 0
        w.resize_(100, 100)
        return z.item() + out.sum().item() + w[0, 0].item()

    work()
    gc.collect()
    blocks = live_blocks()
    torch.flagos.empty_cache()
    reserved = torch.flagos.memory_reserved()
    for _ in range(10):
        work()
    gc.collect()
    assert live_blocks() == blocks
    torch.flagos.empty_cache()
    assert torch.flagos.memory_reserved() == reserved


def test_max_memory_allocated_and_reset_peak():
    torch.flagos.reset_peak_memory_stats()
    base = allocated()
    assert torch.flagos.max_memory_allocated() == base
    t = torch.empty(2 * MiB, dtype=torch.uint8, device="flagos")
    del t
    assert torch.flagos.max_memory_allocated() >= base + 2 * MiB
    assert allocated() == base
    torch.flagos.reset_peak_memory_stats()
    assert torch.flagos.max_memory_allocated() == base


def test_memory_reserved_at_least_allocated():
    t = torch.randn(100_000, device="flagos")
    assert torch.flagos.memory_reserved() >= torch.flagos.memory_allocated() > 0
    assert torch.flagos.max_memory_reserved() >= torch.flagos.memory_reserved()
    del t


def test_freed_memory_is_cached_and_reused():
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="flagos")
    ptr = t.data_ptr()
    reserved = torch.flagos.memory_reserved()
    del t
    assert torch.flagos.memory_reserved() == reserved  # cached, not returned
    u = torch.empty(3 * MiB, dtype=torch.uint8, device="flagos")
    assert u.data_ptr() == ptr
    assert torch.flagos.memory_reserved() == reserved


def test_empty_cache_lowers_memory_reserved():
    # On the cuda driver (CUDA's caching allocator) a block is carved from the
    # free part of a segment that a live tensor keeps reserved wherever one
    # fits; one larger than all the cached memory gets a segment of its own.
    torch.flagos.empty_cache()
    cached = torch.flagos.memory_reserved() - torch.flagos.memory_allocated()
    size = cached + 64 * MiB
    t = torch.empty(size, dtype=torch.uint8, device="flagos")
    del t
    before = torch.flagos.memory_reserved()
    torch.flagos.empty_cache()
    after = torch.flagos.memory_reserved()
    assert after <= before - size
    assert after >= torch.flagos.memory_allocated()


@pytest.mark.skipif(torch_fl.driver() == "cuda", reason="the host driver's allocator")
def test_cache_goes_back_before_a_new_block_when_the_machine_is_short():
    # The host driver's allocations succeed until the OOM killer strikes, so the
    # allocator asks whether the machine has room for a new large block, and
    # gives its cache back first when it has not.
    torch.flagos.empty_cache()
    cached = torch.empty(4 * MiB, dtype=torch.uint8, device="flagos")
    del cached
    assert torch.flagos.memory_reserved() >= 4 * MiB
    retries = torch.flagos.memory_stats()["num_alloc_retries"]
    with machine_memory(64 * MiB):  # room: the cache stays
        a = torch.empty(8 * MiB, dtype=torch.uint8, device="flagos")
        assert torch.flagos.memory_reserved() >= 12 * MiB
        assert torch.flagos.memory_stats()["num_alloc_retries"] == retries
        del a  # two blocks cached now
    with machine_memory(1 * MiB):  # short: the cache goes back
        b = torch.empty(16 * MiB, dtype=torch.uint8, device="flagos")
        assert torch.flagos.memory_reserved() == torch.flagos.memory_allocated()
        assert torch.flagos.memory_stats()["num_alloc_retries"] == retries + 1
        b.fill_(5)
        assert int(b[-1]) == 5
        # Small blocks never ask (reading the machine costs more than they do).
        small = torch.empty(1000, device="flagos")
        assert torch.flagos.memory_stats()["num_alloc_retries"] == retries + 1
        del b, small


def test_memory_stats_keys_and_consistency():
    before = torch.flagos.memory_stats()
    t = torch.randn(1000, device="flagos")
    stats = torch.flagos.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "reserved_bytes.all.current", "active_bytes.all.current",
                "requested_bytes.all.current", "allocation.all.current",
                "segment.all.current", "allocated_bytes.small_pool.current",
                "allocated_bytes.large_pool.current", "num_ooms", "num_alloc_retries",
                # the rest of torch.cuda.memory_stats()'s keys
                "inactive_split.all.current", "inactive_split_bytes.large_pool.peak",
                "oversize_allocations.current", "oversize_segments.peak",
                "num_sync_all_streams", "num_device_alloc", "num_device_free", "max_split_size"):
        assert key in stats, key
    assert list(stats) == sorted(stats)
    if torch_fl.driver() == "cuda":  # the same allocator: the same keys
        assert set(stats) == set(torch.cuda.memory_stats())
    else:  # blocks are never split: no limit, as CUDA reports its default
        assert stats["max_split_size"] == -1 and stats["inactive_split.all.peak"] == 0
    assert stats["allocated_bytes.all.current"] == torch.flagos.memory_allocated()
    assert stats["allocated_bytes.all.current"] == (
        stats["allocated_bytes.small_pool.current"] + stats["allocated_bytes.large_pool.current"])

    def delta(key):
        return stats[key] - before[key]

    assert delta("requested_bytes.all.current") == nbytes(t)
    assert delta("allocated_bytes.all.current") >= nbytes(t)
    assert delta("allocated_bytes.small_pool.current") == delta("allocated_bytes.all.current")
    assert delta("allocation.all.current") == 1
    assert delta("active_bytes.all.current") == delta("allocated_bytes.all.current")
    del t


def test_memory_allocated_is_exact_when_a_larger_cached_block_is_reused():
    base = allocated()
    a = torch.empty(4096, dtype=torch.uint8, device="flagos")
    ptr = a.data_ptr()
    del a  # cached: a 4096-byte block
    b = torch.empty(3584, dtype=torch.uint8, device="flagos")
    assert b.data_ptr() == ptr  # served from the cache
    held = allocated() - base
    del b
    assert allocated() == base  # falls back exactly...
    assert held >= 3584  # ...after counting what the tensor holds
    stats = torch.flagos.memory_stats()
    assert stats["allocated_bytes.all.current"] >= 0
    assert stats["requested_bytes.all.current"] <= stats["allocated_bytes.all.current"]


def test_reset_accumulated_memory_stats():
    t = torch.randn(10, device="flagos")
    del t
    torch.flagos.reset_accumulated_memory_stats()
    stats = torch.flagos.memory_stats()
    assert stats["allocation.all.allocated"] == 0
    assert stats["allocation.all.freed"] == 0
    torch.randn(10, device="flagos")
    assert torch.flagos.memory_stats()["allocation.all.allocated"] >= 1


def test_accelerator_memory_api_agrees():
    last = torch.flagos.device_count() - 1  # 1 with two devices
    t = torch.randn(50_000, device=f"flagos:{last}")
    assert torch.accelerator.memory_allocated(last) == torch.flagos.memory_allocated(last)
    assert torch.accelerator.memory_allocated(0) == torch.flagos.memory_allocated(0)
    assert torch.accelerator.memory_reserved(last) == torch.flagos.memory_reserved(last)
    assert torch.accelerator.max_memory_allocated(last) == torch.flagos.max_memory_allocated(last)
    stats = torch.accelerator.memory_stats(last)
    assert stats["allocated_bytes.all.current"] == torch.flagos.memory_allocated(last)
    del t


def test_memory_summary_shows_the_counters():
    t = torch.randn(3000 + torch.randint(0, 1000, ()).item(), device="flagos")
    stats = torch.flagos.memory_stats()
    table = torch.flagos.memory_summary()
    rows = {}
    for line in table.splitlines():  # columns are two or more spaces apart
        label, *cells = re.split(r"\s{2,}", line.strip())
        rows[label] = cells
    # Counts print as they are: current, peak, total allocated, total freed.
    for title, prefix in (("Allocations", "allocation"), ("Active allocs", "active"),
                          ("Segments", "segment")):
        assert rows[title] == [str(stats[f"{prefix}.all.{c}"])
                               for c in ("current", "peak", "allocated", "freed")], table
    assert "from small pool" in table and "from large pool" in table
    short = torch.flagos.memory_summary(0, abbreviated=True)
    assert "Allocated memory" in short and "from small pool" not in short
    assert f"Out-of-memory errors: {stats['num_ooms']}" in table
    with pytest.raises(RuntimeError, match="out of range"):
        torch.flagos.memory_summary(torch.flagos.device_count())
    del t


def test_memory_stats_as_nested_dict_matches_the_flat_keys():
    t = torch.randn(500, device="flagos")
    flat = torch.flagos.memory_stats()
    nested = torch.flagos.memory_stats_as_nested_dict()
    for key, value in flat.items():
        node = nested
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    del t


def test_reset_max_memory_allocated_resets_the_peak():
    big = torch.empty(8 * MiB, dtype=torch.uint8, device="flagos")
    del big
    assert torch.flagos.max_memory_allocated() > allocated()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.flagos.reset_max_memory_allocated()
    assert torch.flagos.max_memory_allocated() == allocated()


def test_per_process_memory_fraction_round_trip_and_bad_values():
    assert torch.flagos.get_per_process_memory_fraction() == 1.0
    try:
        torch.flagos.set_per_process_memory_fraction(0.5)
        assert torch.flagos.get_per_process_memory_fraction(0) == 0.5
        if torch_fl.driver() == "cuda":  # one caching allocator for both
            assert torch.cuda.get_per_process_memory_fraction(0) == 0.5
        t = torch.randn(1000, device="flagos")  # well under half the device
        torch.testing.assert_close((t * 2).cpu(), t.cpu() * 2)
    finally:
        torch.flagos.set_per_process_memory_fraction(1.0)
    assert torch.flagos.get_per_process_memory_fraction() == 1.0
    with pytest.raises(TypeError, match="float, not int"):
        torch.flagos.set_per_process_memory_fraction(1)
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match="allowed range is 0 to 1"):
            torch.flagos.set_per_process_memory_fraction(bad)
    n = torch.flagos.device_count()
    with pytest.raises(RuntimeError, match=rf"{n + 2}.*0\.\.{n - 1}"):
        torch.flagos.set_per_process_memory_fraction(0.5, n + 2)
    with pytest.raises(RuntimeError, match=rf"{n + 2}.*0\.\.{n - 1}"):
        torch.flagos.get_per_process_memory_fraction(n + 2)
    assert torch.flagos.get_per_process_memory_fraction() == 1.0


def test_cached_names_are_the_reserved_functions():
    # 64 MiB: a segment of its own on the CUDA allocator too (a smaller block
    # may share one with tensors other tests left alive, which empty_cache keeps).
    t = torch.empty(64 * MiB, dtype=torch.uint8, device="flagos")
    with pytest.warns(FutureWarning, match="renamed to torch.flagos.memory_reserved"):
        assert torch.flagos.memory_cached() == torch.flagos.memory_reserved()
    with pytest.warns(FutureWarning, match="renamed to torch.flagos.max_memory_reserved"):
        assert torch.flagos.max_memory_cached() == torch.flagos.max_memory_reserved()
    del t
    torch.flagos.empty_cache()
    assert torch.flagos.max_memory_reserved() > torch.flagos.memory_reserved()
    with pytest.warns(FutureWarning, match="reset_peak_memory_stats"):
        torch.flagos.reset_max_memory_cached()
    assert torch.flagos.max_memory_reserved() == torch.flagos.memory_reserved()


def test_mem_get_info_reports_free_and_total():
    free, total = torch.flagos.mem_get_info()
    assert 0 < free <= total
    t = torch.empty(4 * MiB, dtype=torch.uint8, device="flagos")
    free2, total2 = torch.flagos.mem_get_info()
    assert total2 == total
    assert free2 <= total
    del t
    if torch_fl.driver() != "cuda":
        # The machine's own figure moves with other processes: held still here.
        with machine_memory(2**62):
            torch.flagos.empty_cache()  # so that the next block comes from the machine
            before = torch.flagos.mem_get_info()[0]
            big = torch.empty(16 * MiB, dtype=torch.uint8, device="flagos")
            assert torch.flagos.mem_get_info()[0] <= before - 16 * MiB
            del big


@pytest.mark.skipif(torch_fl.driver() == "cuda", reason="the host driver's memory")
def test_free_memory_is_no_more_than_the_machine_can_give():
    # Host memory is the machine's: other processes and cgroup limits take from
    # it, as other processes take from a GPU's free memory.
    with machine_memory(3 * MiB):
        free, total = torch.flagos.mem_get_info()
        assert free == 3 * MiB < total
        assert torch.accelerator.get_memory_info(0) == (free, total)
        assert torch.flagos.get_device_properties(0).total_memory == total


def test_memory_functions_reject_bad_device():
    n = torch.flagos.device_count()
    with pytest.raises(RuntimeError, match=rf"{n + 2}.*0\.\.{n - 1}"):
        torch.flagos.memory_allocated(n + 2)
    with pytest.raises(ValueError):
        torch.flagos.memory_allocated("cpu")


# ---------------------------------------------------------------- OOM (subprocess)


def test_oom_raises_out_of_memory_error_naming_size_and_free(oom_run):
    rc, out, err = oom_run.result()
    assert "OOM1:" in out, (rc, out, err)
    line = next(line for line in out.splitlines() if line.startswith("OOM1:"))
    # CUDA's opening words, which libraries match (accelerate's batch-size search)
    assert "flagos out of memory. Tried to allocate 128.00 MiB on device 0." in line
    assert "free" in line
    assert "FLAGOS_HOST_MEMORY_LIMIT" in line


def test_device_still_works_after_oom(oom_run):
    rc, out, err = oom_run.result()
    assert "RECOVERED" in out, (rc, out, err)


def test_oom_in_op_result_raises_out_of_memory_error(oom_run):
    rc, out, err = oom_run.result()
    assert "OOM2:" in out, (rc, out, err)
    assert "free" in out.split("OOM2:")[1].splitlines()[0]


def test_cache_is_released_and_allocation_retried_before_oom(oom_run):
    rc, out, err = oom_run.result()
    assert "RETRIED" in out, (rc, out, err)


def test_memory_limit_applies_per_device(oom_run):
    rc, out, err = oom_run.result()
    assert rc == 0, err
    assert "PER_DEVICE_OK" in out


def test_per_process_memory_fraction_caps_one_device(oom_run):
    rc, out, err = oom_run.result()
    assert "FRACTION_OK" in out, (rc, out, err)
    line = next(line for line in out.splitlines() if line.startswith("OOM3:"))
    assert "10.00 MiB" in line and "16.00 MiB" in line and "0.25" in line, line
    assert "set_per_process_memory_fraction" in line, line


def test_oom_lets_accelerate_find_a_batch_that_fits(oom_run):
    pytest.importorskip("accelerate")
    rc, out, err = oom_run.result()
    line = next((line for line in out.splitlines() if line.startswith("BATCH ")), None)
    assert line is not None, (rc, out, err)
    assert 0 < int(line.split()[1]) <= 64, line  # halved from 256 until it fit the 64 MiB device


# ---------------------------------------------------------------- pinned memory


def test_pin_memory_marks_tensor_pinned():
    src = torch.randn(4)
    assert not src.is_pinned()
    pinned = src.pin_memory()
    assert pinned.is_pinned()
    assert pinned.device.type == "cpu"
    assert torch.equal(pinned, src)
    assert pinned[2:].is_pinned()  # pointers inside the block count too
    assert torch.empty(16, pin_memory=True).is_pinned()


def test_pinned_memory_is_freed_and_forgotten():
    pinned = torch.randn(1024).pin_memory()
    copy = pinned.clone()
    assert not copy.is_pinned()
    del pinned


def test_non_blocking_copy_from_pinned_to_flagos():
    last = torch.flagos.device_count() - 1  # 1 with two devices
    src = torch.randn(256, 33).pin_memory()
    dst = src.to("flagos", non_blocking=True)
    dst1 = src.to(f"flagos:{last}", non_blocking=True)
    torch.flagos.synchronize()
    torch.flagos.synchronize(last)
    assert torch.equal(dst.cpu(), src)
    assert torch.equal(dst1.cpu(), src)
    back = torch.empty(256, 33).pin_memory()
    back.copy_(dst, non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(back, src)


def test_memory_snapshot_and_history_are_cudas_on_the_cuda_driver():
    if torch_fl.driver() != "cuda":
        for call in (torch.flagos.memory_snapshot, torch.flagos.memory._snapshot,
                     torch.flagos.memory._record_memory_history):
            with pytest.raises(RuntimeError, match=r"host driver's allocator records no segments"
                                                   r".*memory_stats\(\) and memory_summary\(\)"):
                call()
        return
    torch.flagos.memory._record_memory_history(max_entries=1000)
    try:
        t = torch.empty(3 * MiB, dtype=torch.uint8, device="flagos")
        ptr = t.data_ptr()
        segments = torch.flagos.memory_snapshot()
        assert any(s["address"] <= ptr < s["address"] + s["total_size"] for s in segments)
        snap = torch.flagos.memory._snapshot()
        traces = [e for trace in snap["device_traces"] for e in trace]
        assert any(e["action"] == "alloc" and e["addr"] == ptr for e in traces)
        del t
    finally:
        torch.flagos.memory._record_memory_history(enabled=None)
