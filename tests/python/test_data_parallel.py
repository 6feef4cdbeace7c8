"""nn.DataParallel and torch.nn.parallel.comm across flagos devices.

On a torch without CUDA's copies between devices (a CPU build), torch_fl
supplies them for flagos (torch_fl/_comm.py); DataParallel picks flagos there.
References are the same modules in float64 on the CPU, without DataParallel.
"""

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import comm

import torch_fl
from torch_fl import _comm

ours = pytest.mark.skipif(
    getattr(torch._C, "_scatter", None) is not _comm._scatter,
    reason="torch has its own copies between devices (a CUDA or XPU build): DataParallel picks that device",
)
two_devices = pytest.mark.skipif(torch.flagos.device_count() < 2, reason="needs two flagos devices")
D0, D1 = torch.device("flagos", 0), torch.device("flagos", 1)


@pytest.fixture(autouse=True)
def restore_device():
    device = torch.flagos.current_device()
    yield
    torch.flagos.set_device(device)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.LayerNorm(12), nn.Linear(12, 3)).double()


def test_torch_keeps_its_own_copies_where_it_has_them():
    # A CUDA build's DataParallel picks cuda and its torch._C._scatter serves cuda devices.
    if torch.backends.cuda.is_built():
        assert torch._C._scatter is not _comm._scatter
        assert torch._C._gather is not _comm._gather
    else:
        assert torch._C._scatter is _comm._scatter
        assert torch._utils._get_available_device_type() == "flagos"


@ours
@two_devices
@pytest.mark.parametrize("input_device", ["cpu", "flagos:0", "flagos:1"])
def test_training_matches_one_cpu_module(input_device):
    ref, model = make_model(0), make_model(0).to(D0)
    dp = nn.DataParallel(model, device_ids=[0, 1])
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(9, 6, dtype=torch.float64), torch.randn(9, 3, dtype=torch.float64)
        out = dp(x.to(input_device))
        assert out.device == D0
        loss = (out - y.to(D0)).square().mean()
        loss_ref = (ref(x) - y).square().mean()
        torch.testing.assert_close(loss.cpu(), loss_ref, rtol=1e-12, atol=1e-12)
        for o in (opt, opt_ref):
            o.zero_grad()
        loss.backward()
        loss_ref.backward()
        opt.step()
        opt_ref.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.device == D0
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-12, atol=1e-12)


@ours
@two_devices
def test_inference_with_kwargs_buffers_and_uneven_batch():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = make_model(2)
            self.norm = nn.BatchNorm1d(3).double().eval()
            self.norm.running_mean.uniform_(-1, 1)

        def forward(self, x, *, scale):
            return self.norm(self.body(x)) * scale

    ref = Net()
    dp = nn.DataParallel(Net().to(D0))
    dp.module.load_state_dict(ref.state_dict())
    x = torch.randn(3, 6, dtype=torch.float64)  # 3 rows over 2 devices: chunks of 2 and 1
    with torch.no_grad():
        out = dp(x.to(D1), scale=2.0)
    torch.testing.assert_close(out.cpu(), ref(x, scale=2.0).detach(),
                               rtol=1e-12, atol=1e-12)


@ours
@two_devices
def test_cpu_input_leaves_current_device_and_streams():
    dp = nn.DataParallel(make_model(3).to(D0), device_ids=[0, 1])
    streams = [torch.flagos.current_stream(i) for i in range(2)]
    torch.flagos.set_device(0)
    dp(torch.randn(4, 6, dtype=torch.float64))  # copied on DataParallel's own streams
    assert torch.flagos.current_device() == 0
    assert [torch.flagos.current_stream(i) for i in range(2)] == streams


@ours
def test_one_device_moves_the_module_as_cuda_does():
    model = make_model(4)
    dp = nn.DataParallel(model, device_ids=[0])
    assert next(model.parameters()).device == D0
    x = torch.randn(5, 6, dtype=torch.float64)
    torch.testing.assert_close(dp(x).cpu(), make_model(4)(x).detach(), rtol=1e-12, atol=1e-12)


@ours
@two_devices
def test_broadcast_and_broadcast_coalesced():
    t = torch.randn(4, 5, device=D1)
    copies = comm.broadcast(t, [0, 1, 0])
    assert [c.device for c in copies] == [D0, D1, D0]
    assert copies[1] is t and copies[0] is not copies[2]
    assert all(torch.equal(c.cpu(), t.cpu()) for c in copies)
    assert comm.broadcast(t, out=[torch.empty(4, 5, device=D0)])[0].cpu().equal(t.cpu())

    # Mixed dtypes: coalesced per type, returned in the inputs' order.
    tensors = [torch.randn(3, device=D0), torch.arange(7, device=D0), torch.randn(2, 2, device=D0),
               torch.randint(0, 9, (4,), device=D0)]
    mine, theirs = comm.broadcast_coalesced(tensors, [0, 1])  # one buffer per dtype
    assert all(a is b for a, b in zip(mine, tensors))
    assert [x.device for x in theirs] == [D1] * 4
    for a, b in zip(tensors, theirs):
        assert a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    # Each copy has its own version counter, not the shared buffer's.
    before = theirs[2]._version
    theirs[0].add_(1)
    assert theirs[2]._version == before


@ours
@two_devices
def test_scatter_gather_and_reduce_add():
    src = torch.randn(10, 3)
    parts = comm.scatter(src, [0, 1], chunk_sizes=[4, 6])
    assert [(p.device, p.shape[0]) for p in parts] == [(D0, 4), (D1, 6)]
    assert torch.equal(torch.cat([p.cpu() for p in parts]), src)
    on1 = src.to(D1)
    along1 = comm.scatter(on1, [0, 1], dim=-1)
    # The part for the source's own device is a view of it, not a copy (as CUDA's).
    assert along1[1].untyped_storage().data_ptr() == on1.untyped_storage().data_ptr()
    assert along1[0].device == D0
    assert torch.equal(torch.cat([p.cpu() for p in along1], 1), src)
    outs = [torch.empty(3, 3, device=D0), torch.empty(7, 3, device=D1)]
    assert comm.scatter(src, out=outs)[1] is outs[1]
    assert torch.equal(torch.cat([o.cpu() for o in outs]), src)

    assert comm.gather(parts, destination="cpu").equal(src)
    assert comm.gather(parts, destination=1).device == D1
    torch.flagos.set_device(1)
    assert comm.gather(parts).device == D1  # the current device
    out = torch.empty(10, 3, device=D0)
    assert comm.gather(parts, out=out) is out and out.cpu().equal(src)

    a, b = torch.randn(5, device=D0), torch.randn(5, device=D1)
    torch.testing.assert_close(comm.reduce_add([a, b], destination=1).cpu(), a.cpu() + b.cpu())
    (s,) = comm.reduce_add_coalesced([[a], [b]], destination=0)
    assert s.device == D0
    torch.testing.assert_close(s.cpu(), a.cpu() + b.cpu())


@ours
@two_devices
@pytest.mark.parametrize("call, message", [
    (lambda: comm.scatter(torch.ones(4), [0, 1], chunk_sizes=[4]), "len\\(devices\\) = 2 and len\\(chunk_sizes\\) = 1"),
    (lambda: comm.scatter(torch.ones(4), [0, 7]), "flagos device index 7 does not exist"),
    (lambda: comm.scatter(torch.ones(4), [0, 1], streams=[None, torch.flagos.Stream(device=0)]),
     "stream at index 1 \\(was flagos:0\\) to match the device supplied at that index \\(expected flagos:1\\)"),
    (lambda: comm.scatter(torch.ones(4), out=[torch.ones(3)]), "output tensor at index 0 has device 'cpu'"),
    (lambda: comm.scatter(torch.ones(4, 2), out=[torch.ones(3, 2, device="flagos:0")]), "Expected 4, but got total size 3"),
    (lambda: comm.gather([torch.ones(2, device="flagos:0"), torch.ones(2)]), "input tensor at index 1 has device 'cpu'"),
    (lambda: comm.gather([torch.ones(2, 3, device="flagos:0"), torch.ones(2, 4, device="flagos:1")]),
     "Input tensor at index 1 has invalid shape \\[2, 4\\], but expected \\[2, 3\\]"),
    (lambda: comm.gather([torch.ones(2, device="flagos:0")], out=torch.ones(3, device="flagos:0")),
     "Expected out tensor to have shape \\[2\\], but got \\[3\\]"),
    (lambda: comm.broadcast_coalesced([torch.ones(2, device="flagos:1")], [0, 1]), "All tensors must be on devices\\[0\\]: 0"),
    (lambda: comm.gather([torch.ones(2, device="flagos:0")], dim=-2), "range of \\[-1, 0\\], but got -2"),
    (lambda: comm.broadcast(torch.ones(2), out=[torch.ones(3, device="flagos:1")]), "output tensor at index 0 has shape \\[3\\]"),
])
def test_bad_arguments_name_the_culprit(call, message):
    with pytest.raises((RuntimeError, IndexError), match=message):
        call()
