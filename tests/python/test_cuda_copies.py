"""Copies between cuda and flagos on the cuda driver (csrc/aten/copy.cpp).

``.to("flagos")`` from cuda, ``.to("cuda")`` from flagos, ``copy_`` both ways
and ``Module.to`` both ways are CUDA's own device-to-device copies (the same
memory pool, the current streams), never a trip through the CPU.

Marked ``cuda``: skipped unless torch_fl selected the cuda driver.
"""

import pytest
import torch

import torch_fl  # noqa: F401

pytestmark = pytest.mark.cuda


def fresh(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
    assert torch.equal(a.cpu(), b.cpu()), f"max |diff| {(a.cpu().double() - b.cpu().double()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_to_flagos_and_back_keep_every_bit(dtype):
    x = fresh(37, 53, seed=1)
    x = (x > 0) if dtype == torch.bool else (x * 1000).to(dtype)
    xc = x.to("cuda")
    y = xc.to("flagos")
    assert y.device == torch.device("flagos", 0) and y.dtype == dtype
    same_bits(y, x)
    z = y.to("cuda")
    assert z.device == torch.device("cuda", 0)
    same_bits(z, x)
    # Distinct memory: writing the copy leaves the original alone.
    y.zero_() if dtype != torch.bool else y.logical_not_()
    same_bits(xc, x)


def test_copy_both_ways():
    src = fresh(64, 32, seed=2).cuda()
    dst = torch.empty(64, 32, device="flagos")
    assert dst.copy_(src) is dst
    same_bits(dst, src)
    back = torch.empty(64, 32, device="cuda")
    back.copy_(dst * 2)
    same_bits(back, src * 2)


@pytest.mark.parametrize("direction", ["cuda->flagos", "flagos->cuda"])
@pytest.mark.parametrize("src_dtype,dst_dtype", [(torch.float32, torch.bfloat16),
                                                 (torch.bfloat16, torch.float32),
                                                 (torch.float32, torch.float16),
                                                 (torch.float32, torch.int32)])
def test_dtype_conversion_is_cudas(direction, src_dtype, dst_dtype):
    x = (fresh(1000, seed=3) * 100).to(src_dtype)
    expected = x.cuda().to(dst_dtype)  # CUDA's own conversion
    src_dev, dst_dev = direction.split("->")
    got = x.to(src_dev).to(dst_dev, dtype=dst_dtype)
    assert got.device.type == dst_dev
    same_bits(got, expected)
    into = torch.empty(1000, dtype=dst_dtype, device=dst_dev)
    into.copy_(x.to(src_dev))
    same_bits(into, expected)


@pytest.mark.parametrize("direction", ["cuda->flagos", "flagos->cuda"])
def test_strided_sources_and_destinations(direction):
    src_dev, dst_dev = direction.split("->")
    base = fresh(40, 60, seed=4)
    src = base.to(src_dev)
    for view in (lambda t: t.t(), lambda t: t[::3, 5:50:2], lambda t: t[:, :1].expand(40, 7),
                 lambda t: t.unsqueeze(0).permute(2, 0, 1)):
        got = view(src).to(dst_dev)
        same_bits(got, view(base))
    # A non-contiguous destination: only the viewed elements change.
    dst = torch.zeros(60, 40, device=dst_dev)
    dst.t()[::2].copy_(src[::2])
    expected = torch.zeros(60, 40)
    expected.t()[::2].copy_(base[::2])
    same_bits(dst, expected)
    # Broadcasting into a larger destination.
    row = torch.zeros(8, 60, device=dst_dev)
    row.copy_(src[0])
    same_bits(row, base[0].expand(8, 60))


@pytest.mark.parametrize("direction", ["cuda->flagos", "flagos->cuda"])
def test_non_blocking_copy_runs_in_order_on_the_current_stream(direction):
    src_dev, dst_dev = direction.split("->")
    side = torch.cuda.Stream()
    x = torch.zeros(1 << 20, device=src_dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # a slow producer on the side stream...
        x.fill_(7)
        y = x.to(dst_dev, non_blocking=True)  # ...which the copy must follow
        z = torch.empty_like(y)
        z.copy_(x, non_blocking=True)
    side.synchronize()
    assert y.device.type == dst_dev
    assert bool((y == 7).all()) and bool((z == 7).all())


@pytest.mark.parametrize("direction", ["cuda->flagos", "flagos->cuda"])
def test_non_blocking_copy_does_not_wait_for_another_stream(direction):
    src_dev, dst_dev = direction.split("->")
    x = fresh(1 << 16, seed=5).to(src_dev)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x.to(dst_dev)  # warm up: a cached block for the side stream, the copy path
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # the default stream is busy for a while
    with torch.cuda.stream(side):
        y = x.to(dst_dev, non_blocking=True)
    side.synchronize()
    # The copy finished on its own stream while the default stream still sleeps.
    assert not torch.cuda.default_stream().query(), "the copy waited for the default stream"
    torch.cuda.synchronize()
    same_bits(y, x)


def _device_activity(fn):
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events()]


@pytest.mark.parametrize("what", ["to-flagos", "to-cuda", "copy-into-flagos", "copy-into-cuda",
                                  "strided-to-flagos", "bf16-to-cuda"])
def test_copy_never_goes_through_the_host(what):
    xc = fresh(256, 256, seed=6).cuda()
    xf = xc.to("flagos")
    df = torch.empty(256, 256, device="flagos")
    dc = torch.empty(256, 256, device="cuda")
    fn = {"to-flagos": lambda: xc.to("flagos"), "to-cuda": lambda: xf.to("cuda"),
          "copy-into-flagos": lambda: df.copy_(xc), "copy-into-cuda": lambda: dc.copy_(xf),
          "strided-to-flagos": lambda: xc.t().to("flagos"),
          "bf16-to-cuda": lambda: xf.to("cuda", dtype=torch.bfloat16)}[what]
    names = _device_activity(fn)
    host_copies = [n for n in names if "HtoD" in n or "DtoH" in n]
    assert not host_copies, f"{what}: copies through the host: {host_copies}"
    # And the copy did happen on the device: a device-to-device memcpy or a
    # copy kernel.
    assert any("DtoD" in n or ("copy" in n.lower() and "kernel" in n.lower()) for n in names), names


class TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.emb.weight  # tied, as language models do
        self.register_buffer("scale", torch.full((16,), 0.5))

    def forward(self, ids):
        return self.head(self.norm(self.emb(ids)) * self.scale)


def test_module_to_round_trip_keeps_parameters_and_tied_weights():
    torch.manual_seed(0)
    model = TiedLM().cuda()
    ids = torch.randint(0, 50, (4, 9), device="cuda")
    params = {name: id(p) for name, p in model.named_parameters()}
    with torch.no_grad():
        expected = model(ids)
    model.emb.weight.grad = torch.ones_like(model.emb.weight)

    model.to("flagos")
    assert all(p.device.type == "flagos" for p in model.parameters())
    assert model.scale.device.type == "flagos"
    assert model.head.weight is model.emb.weight, "Module.to('flagos') untied the shared weight"
    assert {name: id(p) for name, p in model.named_parameters()} == params
    assert model.emb.weight.grad.device.type == "flagos"
    torch_fl.routing.set_route("*", "cuda")
    try:
        with torch.no_grad():
            same_bits(model(ids.to("flagos")), expected)
    finally:
        torch_fl.routing.set_route("*", "")

    model.to("cuda")
    assert all(p.device.type == "cuda" for p in model.parameters())
    assert model.head.weight is model.emb.weight, "Module.to('cuda') untied the shared weight"
    assert {name: id(p) for name, p in model.named_parameters()} == params
    with torch.no_grad():
        same_bits(model(ids), expected)
    same_bits(model.emb.weight.grad, torch.ones(50, 16))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_copies_across_device_indices_are_peer_copies():
    x = fresh(1000, seed=7)
    on_cuda1 = x.to("cuda:1")
    y = on_cuda1.to("flagos:0")
    assert y.device == torch.device("flagos", 0)
    same_bits(y, x)
    back = y.to("cuda:1")
    assert back.device == torch.device("cuda", 1)
    same_bits(back, x)
    z = torch.empty(1000, device="flagos:1")
    z.copy_(x.to("cuda:0"))
    same_bits(z, x)


def test_host_driver_refuses_cuda_tensors_by_name(run_py):
    # With FLAGOS_ACCELERATOR=host flagos memory is host memory: a direct copy
    # with a cuda tensor is refused with the way out, not silently staged.
    code = """
import torch, torch_fl
assert torch_fl.driver() == "host"
x = torch.ones(4, device="flagos")
for fn in (lambda: x.to("cuda"), lambda: torch.ones(4, device="cuda").to("flagos")):
    try:
        fn()
    except RuntimeError as e:
        print("ERROR", e)
    else:
        print("NO ERROR")
"""
    rc, out, err = run_py(code, env={"FLAGOS_ACCELERATOR": "host"})
    assert rc == 0, err
    lines = [line for line in out.splitlines() if line.startswith(("ERROR", "NO ERROR"))]
    assert len(lines) == 2, out + err
    for line in lines:
        assert line.startswith("ERROR") and "host driver" in line and ".cpu()" in line, line
