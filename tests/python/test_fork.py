"""flagos and fork(): the CUDA contract.

A child forked after the parent initialised the device must not use it: every
device call there, and torch.flagos.init(), raises a RuntimeError saying "Cannot
re-initialize flagos in forked subprocess" (CUDA's words) and pointing to the
'spawn' start method. Work that does
not touch the device keeps working in forked children (DataLoader workers
producing CPU batches), and the parent is unaffected.
"""

import gc
import os
import select
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset

# The host driver's contract; the cuda driver defers to torch.cuda's own checks.
pytestmark = pytest.mark.host_only

CHILD_TIMEOUT_S = 60
# CUDA's words, with flagos for CUDA (PyTorch's reference backend tests them too).
FORK_MESSAGE = ("Cannot re-initialize flagos in forked subprocess. To use flagos with "
                "multiprocessing, you must use the 'spawn' start method")


def run_in_forked_child(fn):
    """Runs ``fn()`` in an os.fork() child; returns (exit status, what it reported).

    The child reports ``OK <repr>`` or ``<ExceptionType>: <message>`` through a
    pipe and leaves with os._exit (no pytest teardown in the child). A child
    that neither reports nor exits within CHILD_TIMEOUT_S is killed and the
    test fails (a hang).
    """
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            try:
                result = fn()
                msg = f"OK {result!r}"
            except BaseException as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"
            os.write(write_fd, msg.encode(errors="replace"))
        except BaseException:  # noqa: BLE001
            code = 3
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(0.0, left))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"forked child hung for {CHILD_TIMEOUT_S}s")
            data = os.read(read_fd, 65536)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    return status, b"".join(chunks).decode()


@pytest.fixture
def initialised():
    """A flagos tensor in this (the parent) process: the device is initialised."""
    x = torch.arange(6.0, device="flagos")
    assert torch_fl_initialised()
    return x


def torch_fl_initialised():
    import torch_fl

    return torch_fl._C._is_initialized()


# Each entry: what the child tries on the device the parent initialised.
DEVICE_USES = {
    "new tensor": lambda x: torch.randn(2, device="flagos"),
    "copy to device": lambda x: torch.ones(2).to("flagos"),
    "op on inherited tensor": lambda x: x + 1,
    "in-place op on inherited tensor": lambda x: x.mul_(2),
    "copy inherited tensor to cpu": lambda x: x.cpu(),
    "item": lambda x: x[1].item(),
    "matmul": lambda x: x.view(2, 3) @ x.view(3, 2),
    "synchronize": lambda x: torch.flagos.synchronize(),
    "set_device": lambda x: torch.flagos.set_device(0),
    "current_device": lambda x: torch.flagos.current_device(),
    "new stream": lambda x: torch.flagos.Stream(),
    "current stream": lambda x: torch.flagos.current_stream(),
    "event record": lambda x: torch.Event(device="flagos").record(),
    "manual_seed": lambda x: torch.flagos.manual_seed(0),
    "get_rng_state": lambda x: torch.flagos.get_rng_state(),
    "memory_allocated": lambda x: torch.flagos.memory_allocated(),
    "mem_get_info": lambda x: torch.flagos.mem_get_info(),
    "module.to": lambda x: torch.nn.Linear(2, 2).to("flagos"),
    "init": lambda x: torch.flagos.init(),
}


@pytest.mark.parametrize("use", list(DEVICE_USES), ids=list(DEVICE_USES))
def test_device_use_in_a_child_forked_after_init_raises_clear_error(initialised, use):
    fn = DEVICE_USES[use]
    status, message = run_in_forked_child(lambda: fn(initialised))
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, message)
    assert message.startswith("RuntimeError: "), message
    assert FORK_MESSAGE in message and "spawn" in message, message
    # The parent is untouched and still computes.
    assert not torch.flagos._is_in_bad_fork()
    torch.testing.assert_close((initialised + 1).cpu(), torch.arange(6.0) + 1)


def test_forked_child_reports_bad_fork_and_may_still_query_and_free(initialised):
    # The only reference to this tensor is the list: the child drops it, so the
    # tensor is freed there (through the allocator) without touching the device.
    box = [initialised * 3]

    def child():
        bad = torch.flagos._is_in_bad_fork()
        count = torch.flagos.device_count()
        available = torch.flagos.is_available()
        box.clear()
        gc.collect()
        torch.flagos.empty_cache()
        return (bad, count, available, torch.flagos.is_initialized())

    status, message = run_in_forked_child(child)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, message)
    assert message == f"OK (True, {torch.flagos.device_count()}, True, False)", message
    torch.testing.assert_close(box[0].cpu(), torch.arange(6.0) * 3)


def test_multiprocessing_fork_child_gets_the_error(initialised):
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_mp_child_uses_device, args=(queue,))
    proc.start()
    try:
        message = queue.get(timeout=CHILD_TIMEOUT_S)
    finally:
        proc.join(CHILD_TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
    assert message.startswith("RuntimeError: "), message
    assert FORK_MESSAGE in message, message


def _mp_child_uses_device(queue):
    try:
        torch.ones(2, device="flagos")
        queue.put("NO ERROR")
    except Exception as e:  # noqa: BLE001
        queue.put(f"{type(e).__name__}: {e}")


class _CpuDataset(Dataset):
    """Batches made on the CPU only: fine in forked workers."""

    def __len__(self):
        return 37

    def __getitem__(self, i):
        return torch.full((3, 4), float(i)) + torch.arange(4.0), i


@pytest.mark.parametrize("pin_memory", [False, True], ids=["pageable", "pinned"])
def test_dataloader_fork_workers_that_do_not_touch_the_device_work(initialised, pin_memory):
    loader = DataLoader(_CpuDataset(), batch_size=5, shuffle=False, num_workers=2,
                        multiprocessing_context="fork", pin_memory=pin_memory)
    weight = torch.linspace(-1, 1, 4, device="flagos")
    seen = []
    for epoch in range(2):
        for xb, ib in loader:
            if pin_memory:
                assert xb.is_pinned()
            xd = xb.to("flagos", non_blocking=pin_memory)
            out = (xd * weight).sum(dim=-1)
            expected = (xb * torch.linspace(-1, 1, 4)).sum(dim=-1)
            torch.testing.assert_close(out.cpu(), expected)
            seen.extend(ib.tolist())
    assert seen == list(range(37)) * 2
    assert not torch.flagos._is_in_bad_fork()


class _DeviceDataset(Dataset):
    """A dataset whose items are computed on a flagos tensor made in the parent."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i] * 2


def test_dataloader_fork_worker_touching_the_device_fails_clearly(initialised):
    loader = DataLoader(_DeviceDataset(initialised), batch_size=2, num_workers=2,
                        multiprocessing_context="fork")
    batches = iter(loader)
    try:
        with pytest.raises(RuntimeError) as info:
            for _ in batches:
                pass
        message = str(info.value)
        del info  # its traceback holds the iterator
    finally:
        # Stop the workers now: left to garbage collection at interpreter exit,
        # their shutdown waits out DataLoader's 5 s status interval per worker.
        batches._shutdown_workers()
    assert "DataLoader worker process" in message, message
    assert FORK_MESSAGE in message and "spawn" in message, message
    # The parent still works after its workers failed.
    torch.testing.assert_close((initialised * 2).cpu(), torch.arange(6.0) * 2)


FORK_BEFORE_INIT = r"""
import os, torch, torch_fl
assert not torch_fl._C._is_initialized()
pid = os.fork()
if pid == 0:
    code = 1
    try:
        x = torch.arange(4.0, device="flagos")
        assert (x * 2).cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
        assert not torch.flagos._is_in_bad_fork()
        code = 0
    finally:
        os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
# and the parent can still initialise and use the device afterwards
assert (torch.ones(2, device="flagos") + 1).cpu().tolist() == [2.0, 2.0]
print("FORK_BEFORE_INIT_OK")
"""


def test_child_forked_before_init_may_use_the_device(run_py):
    rc, out, err = run_py(FORK_BEFORE_INIT)
    assert rc == 0, err
    assert "FORK_BEFORE_INIT_OK" in out


IS_INITIALIZED = r"""
import torch, torch_fl
before = torch.flagos.is_initialized()
torch.ones(1, device="flagos")
after = torch.flagos.is_initialized()
print("IS_INITIALIZED", before, after)
"""


def test_is_initialized_is_false_until_first_use(run_py):
    rc, out, err = run_py(IS_INITIALIZED)
    assert rc == 0, err
    assert "IS_INITIALIZED False True" in out, out
