"""flagos tensors and torch.multiprocessing (torch_fl/flagos/_sharing.py,
csrc/ipc/): a flagos tensor or storage sent to another process arrives as a flagos
tensor over the same memory, as CPU and CUDA tensors do: writes on either side are
seen by the other. The host driver moves a storage into a CPU shared-memory segment
on its first trip; the cuda driver sends CUDA memory by CUDA IPC. What cannot be
sent is refused with CUDA's reasons, where the caller pickles or, for a Queue, in
the receiver; neither side hangs. CPU tensors travel exactly as before.

One receiving process (spawned, as CUDA requires) serves the module's tests."""

import queue as queue_module

import pytest
import torch
import torch.multiprocessing as mp

import torch_fl

TIMEOUT_S = 90
HOST = torch_fl._C._driver_name() == "host"


def _describe(t):
    if isinstance(t, tuple):  # views sent together: one storage on arrival?
        return {"parts": [_describe(p) for p in t],
                "one_storage": len({p.untyped_storage()._cdata for p in t}) == 1}
    if isinstance(t, torch.storage.TypedStorage):
        return {"type": "TypedStorage", "device": str(t.device), "dtype": t.dtype,
                "values": t.cpu().tolist()}
    if isinstance(t, torch.UntypedStorage):
        return {"type": "UntypedStorage", "device": str(t.device), "nbytes": t.nbytes(),
                "bytes": bytes(t.cpu())}
    return {"type": type(t).__name__, "device": str(t.device), "dtype": t.dtype,
            "shape": tuple(t.shape), "stride": t.stride(), "offset": t.storage_offset(),
            "requires_grad": t.requires_grad, "conj": t.is_conj(), "neg": t.is_neg(),
            "cpu": t.detach().cpu().resolve_conj().resolve_neg().clone()}


def _serve(inbox, outbox):
    """The receiving process: runs the parent's commands on the objects it gets."""
    held = {}
    while True:
        try:
            command, key, obj = inbox.get()
        except Exception as e:  # noqa: BLE001  (an object that failed to arrive)
            outbox.put(("error", f"{type(e).__name__}: {e}"))
            continue
        try:
            if command == "stop":
                return
            if command == "describe":
                outbox.put(("ok", _describe(obj)))
            elif command == "hold":  # keep it, answer once it is readable
                held[key] = obj
                outbox.put(("ok", None))
            elif command == "read":
                outbox.put(("ok", _describe(held[key])))
            elif command == "fill":
                held[key].fill_(obj)
                torch.flagos.synchronize()
                outbox.put(("ok", None))
            elif command == "send_back":
                outbox.put(("ok", held[key]))
            elif command == "drop":
                del held[key]
                outbox.put(("ok", None))
        except Exception as e:  # noqa: BLE001  (reported to the parent)
            outbox.put(("error", f"{type(e).__name__}: {e}"))


@pytest.fixture(scope="module")
def receiver():
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    process = ctx.Process(target=_serve, args=(inbox, outbox), daemon=True)
    process.start()

    def call(command, obj=None, key=None):
        inbox.put((command, key, obj))
        try:
            kind, value = outbox.get(timeout=TIMEOUT_S)
        except queue_module.Empty:
            pytest.fail(f"the receiving process did not answer {command!r}")
        if kind == "error":
            raise RuntimeError(value)
        return value

    yield call
    inbox.put(("stop", None, None))
    process.join(TIMEOUT_S)
    if process.is_alive():
        process.kill()
        pytest.fail("the receiving process hung")
    assert process.exitcode == 0


@pytest.mark.parametrize("make", [
    lambda: torch.randn(5, 3, device="flagos"),
    lambda: torch.randn(6, 4, device="flagos")[1:, ::2],
    lambda: torch.randn(4, 4, device="flagos").t(),
    lambda: torch.randint(-100, 100, (7,), dtype=torch.int64, device="flagos"),
    lambda: torch.randn(3, 2, device="flagos").to(torch.bfloat16),
    lambda: torch.randn(4, dtype=torch.complex64, device="flagos").conj(),
    lambda: torch.randn(4, dtype=torch.complex64, device="flagos").conj().imag,
    lambda: torch.tensor(2.5, device="flagos"),
    lambda: torch.empty(0, 3, device="flagos"),
], ids=["contiguous", "offset_strided_view", "transposed", "int64", "bfloat16", "conj", "neg",
        "scalar", "empty"])
def test_a_flagos_tensor_arrives_with_its_values_and_geometry(receiver, make):
    t = make()
    got = receiver("describe", t)
    assert got["type"] == "Tensor" and got["device"] == str(t.device)
    assert (got["dtype"], got["shape"], got["stride"], got["offset"], got["conj"], got["neg"]) == (
        t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.is_conj(), t.is_neg())
    assert torch.equal(got["cpu"], t.cpu().resolve_conj().resolve_neg())


def test_a_tensor_on_the_second_device_arrives_there(receiver):
    t = torch.randn(2, 3, device="flagos:1")
    got = receiver("describe", t)
    assert got["device"] == "flagos:1" and torch.equal(got["cpu"], t.cpu())


def test_a_parameter_arrives_as_a_parameter_that_requires_grad(receiver):
    p = torch.nn.Parameter(torch.randn(3, 2, device="flagos"))
    got = receiver("describe", p)
    assert (got["type"], got["requires_grad"]) == ("Parameter", True)
    assert torch.equal(got["cpu"], p.detach().cpu())


def test_a_leaf_that_requires_grad_arrives_requiring_grad(receiver):
    x = torch.randn(4, device="flagos", requires_grad=True)
    got = receiver("describe", x)
    assert (got["type"], got["requires_grad"]) == ("Tensor", True)
    assert torch.equal(got["cpu"], x.detach().cpu())


def test_views_sent_together_arrive_over_one_storage(receiver):
    t = torch.randn(12, device="flagos")
    got = receiver("describe", (t, t[2:], t.view(3, 4)[:, 1]))
    assert got["one_storage"]
    assert [torch.equal(p["cpu"], v.cpu()) for p, v in zip(got["parts"], (t, t[2:], t.view(3, 4)[:, 1]))] \
        == [True] * 3


def test_a_typed_storage_arrives_as_one(receiver):
    t = torch.arange(5.0, device="flagos")
    got = receiver("describe", t.storage())
    assert (got["type"], got["device"], got["dtype"], got["values"]) == (
        "TypedStorage", str(t.device), torch.float32, [0.0, 1.0, 2.0, 3.0, 4.0])


def test_a_flagos_storage_arrives_as_a_flagos_storage(receiver):
    s = torch.randn(6, device="flagos").untyped_storage()
    got = receiver("describe", s)
    assert got["type"] == "UntypedStorage" and got["device"].startswith("flagos")
    assert (got["nbytes"], got["bytes"]) == (s.nbytes(), bytes(s.cpu()))


def test_both_processes_use_the_same_memory(receiver):
    t = torch.zeros(8, device="flagos")
    receiver("hold", t, key="shared")
    receiver("fill", 7.0, key="shared")  # the receiver writes, the sender sees it
    assert torch.equal(t.cpu(), torch.full((8,), 7.0))
    t[2:5] = -1.0  # the sender writes, the receiver sees it
    torch.flagos.synchronize()
    expected = torch.full((8,), 7.0)
    expected[2:5] = -1.0
    assert torch.equal(receiver("read", key="shared")["cpu"], expected)
    receiver("drop", key="shared")


def test_the_memory_outlives_the_sender_s_tensor(receiver):
    t = torch.randn(1000, device="flagos")
    expected = t.cpu()
    receiver("hold", t, key="orphan")
    del t
    torch.randn(1000, device="flagos").fill_(3.0)  # would reuse freed memory
    assert torch.equal(receiver("read", key="orphan")["cpu"], expected)
    receiver("drop", key="orphan")


def test_ipc_collect_is_there_and_frees_nothing_in_use(receiver):
    t = torch.randn(100, device="flagos")
    receiver("hold", t, key="collect")
    torch.flagos.ipc_collect()
    assert torch.equal(receiver("read", key="collect")["cpu"], t.cpu())
    receiver("drop", key="collect")
    torch.flagos.ipc_collect()


def test_a_tensor_sent_twice_keeps_its_memory(receiver):
    t = torch.randn(64, device="flagos")
    receiver("describe", t)
    address = t.data_ptr()
    receiver("describe", t)
    receiver("describe", t[3:])
    assert t.data_ptr() == address  # no second move on the host driver


def test_a_shared_storage_cannot_be_resized(receiver):
    t = torch.randn(6, device="flagos")
    receiver("describe", t)
    values = t.cpu()
    with pytest.raises(RuntimeError, match="not resizable"):
        t[:].resize_(100)
    with pytest.raises(RuntimeError, match="not resizable"):  # a kernel growing an out= view
        torch.add(torch.ones(100, device="flagos"), 1, out=t[:0])
    assert t.untyped_storage().nbytes() == 24 and torch.equal(t.cpu(), values)


@pytest.mark.host_only  # the host driver's shared-memory segments
def test_host_share_memory_moves_now_and_is_shared_says_so(receiver):
    t = torch.randn(32, device="flagos")
    assert not t.is_shared() and not t.untyped_storage().is_shared()
    values = t.cpu()
    assert t.share_memory_() is t
    assert t.is_shared() and torch.equal(t.cpu(), values)
    address = t.data_ptr()
    assert torch.equal(receiver("describe", t)["cpu"], values)
    assert t.data_ptr() == address  # the trip moved nothing


@pytest.mark.host_only  # the host driver's shared-memory segments
def test_host_strategy_file_system_and_a_change_of_strategy(receiver):
    t = torch.randn(16, device="flagos")
    receiver("describe", t)  # moved into a file_descriptor segment
    old = mp.get_sharing_strategy()
    mp.set_sharing_strategy("file_system")
    try:
        # The segment is of the other strategy: the storage moves again, once.
        assert torch.equal(receiver("describe", t)["cpu"], t.cpu())
        address = t.data_ptr()
        assert torch.equal(receiver("describe", t)["cpu"], t.cpu())
        assert t.data_ptr() == address
        u = torch.randn(5, device="flagos")
        assert torch.equal(receiver("describe", u)["cpu"], u.cpu())
    finally:
        mp.set_sharing_strategy(old)


def test_a_received_tensor_sent_back(receiver):
    t = torch.randn(10, device="flagos")
    receiver("hold", t, key="back")
    if HOST:  # shared memory can be passed on
        back = receiver("send_back", key="back")
        assert back.device == t.device and torch.equal(back.cpu(), t.cpu())
        back.fill_(1.5)
        assert torch.equal(t.cpu(), torch.full((10,), 1.5))
    else:  # CUDA IPC memory can be opened by one process only, as with CUDA tensors
        with pytest.raises(RuntimeError, match=r"received from another process.*clone"):
            receiver("send_back", key="back")
    receiver("drop", key="back")


def test_a_non_leaf_that_requires_grad_is_refused_where_it_is_sent(receiver):
    x = torch.randn(3, device="flagos", requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match=r"non-leaf flagos tensor which requires_grad.*detach"):
        mp.get_context("spawn").SimpleQueue().put(y)
    # Through a Queue (pickled in its feeder thread) the receiver raises, and goes on.
    with pytest.raises(RuntimeError, match=r"sending a flagos tensor of shape \(3,\).*failed.*non-leaf"):
        receiver("describe", y)
    assert torch.equal(receiver("describe", y.detach())["cpu"], y.detach().cpu())


def _child_fills(whole, part, value):
    assert part.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr()
    part.fill_(value)
    torch.flagos.synchronize()


def test_process_arguments_and_pipes_share_the_memory():
    ctx = mp.get_context("spawn")
    t = torch.zeros(5, device="flagos")
    # Two tensors over one storage: one reduction of it (its descriptor listed once).
    child = ctx.Process(target=_child_fills, args=(t, t[1:4], 2.0))
    child.start()
    child.join(TIMEOUT_S)
    assert child.exitcode == 0
    assert t.cpu().tolist() == [0.0, 2.0, 2.0, 2.0, 0.0]
    here, there = ctx.Pipe()
    here.send(t[::2])
    got = there.recv()
    assert got.device == t.device and got.cpu().tolist() == [0.0, 2.0, 0.0]


def _total(t):
    return float(t.sum())


def test_a_process_pool_fails_only_the_task_that_cannot_be_sent():
    import concurrent.futures

    x = torch.randn(3, device="flagos", requires_grad=True)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        bad = pool.submit(_total, x * 2)
        good = pool.submit(_total, torch.ones(4, device="flagos"))
        with pytest.raises(RuntimeError, match="non-leaf flagos tensor"):
            bad.result(TIMEOUT_S)
        assert good.result(TIMEOUT_S) == 4.0


def test_cpu_tensors_still_travel(receiver):
    x = torch.randn(5)
    got = receiver("describe", x)
    assert got["device"] == "cpu" and torch.equal(got["cpu"], x)
