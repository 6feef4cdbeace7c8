"""flagos tensors and torch.multiprocessing (torch_fl/flagos/_sharing.py): PyTorch
shares only CPU and CUDA memory between processes, so sending a flagos tensor is
refused with an error that says what to do, on the sending side where it
pickles, in the receiving process for a Queue (whose feeder thread pickles);
neither side hangs. CPU tensors are shared exactly as before."""

import io
import queue as queue_module

import pytest
import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

TIMEOUT_S = 60


def _pickle(obj):
    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return buf.getvalue()


@pytest.mark.parametrize("make", [
    lambda: torch.arange(4.0, device="flagos"),
    lambda: torch.nn.Parameter(torch.randn(3, device="flagos")),
    lambda: torch.randn(4, 4, device="flagos")[1:, ::2],
    lambda: torch.arange(4.0, device="flagos").untyped_storage(),
], ids=["tensor", "parameter", "view", "storage"])
def test_pickling_a_flagos_object_for_another_process_raises_clearly(make):
    with pytest.raises(RuntimeError, match=r"flagos .*cannot be shared.*\.cpu\(\)"):
        _pickle(make())


def _consume(q, results):
    try:
        t = q.get(timeout=TIMEOUT_S)
        results.put(("ok", t.tolist()))
    except Exception as e:  # noqa: BLE001  (reported to the parent)
        results.put(("error", f"{type(e).__name__}: {e}"))


def _run_consumer(item):
    ctx = mp.get_context("fork")
    q, results = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consume, args=(q, results))
    p.start()
    try:
        q.put(item)
        return results.get(timeout=TIMEOUT_S)
    except queue_module.Empty:
        pytest.fail("the consumer neither received the item nor reported an error")
    finally:
        p.join(TIMEOUT_S)
        if p.is_alive():
            p.kill()
            pytest.fail("the consumer hung")


def test_a_flagos_tensor_on_a_queue_raises_in_the_receiver_instead_of_hanging():
    kind, what = _run_consumer(torch.arange(4.0, device="flagos"))
    assert kind == "error", what
    assert what.startswith("RuntimeError: ") and ".cpu()" in what, what


def test_cpu_tensors_still_travel_through_queues():
    x = torch.randn(5)
    kind, what = _run_consumer(x)
    assert (kind, what) == ("ok", x.tolist())
