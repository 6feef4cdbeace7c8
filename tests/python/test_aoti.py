"""Inductor's C++ wrapper (cpp_wrapper=True) and AOTInductor on flagos (docs/compile.md).

Compiled code is compared with eager flagos under explicit tolerances (Inductor
fuses and reorders float arithmetic). Each test checks that the C++ path really
ran: the generated code calls the flagos C shims, or the package records the
flagos device. Compiling C++ is slow on two cores, so the packages are built
once per module and inputs are small.
"""

import copy
import json
import os
import zipfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

import torch_fl

ON_CUDA = torch_fl.driver() == "cuda"
TOL = dict(rtol=1e-4, atol=1e-5)


def randn(*shape, seed, device="flagos"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device)


def _fn(x, w):
    # mm is an ATen call of the wrapper on both drivers: a flagos C shim. No
    # ties for the sort (stable anyway), so compiled and eager indices agree.
    y = torch.tanh(x @ w) + torch.sin(x).sum(-1, keepdim=True)
    values, indices = torch.sort(y, dim=-1, stable=True)
    return values * 2, indices


@pytest.fixture(scope="module")
def cpp_wrapper_run():
    x, w = randn(8, 16, seed=1), randn(16, 16, seed=2)
    torch._dynamo.reset()
    with inductor_config.patch(cpp_wrapper=True):
        fn = torch.compile(_fn)
        out, codes = run_and_get_code(fn, x, w)
    return fn, (x, w), out, "\n".join(codes)


def test_cpp_wrapper_matches_eager_and_calls_the_flagos_shims(cpp_wrapper_run):
    _, args, out, code = cpp_wrapper_run
    want = _fn(*args)
    assert out[0].device == args[0].device and out[1].device == args[0].device
    torch.testing.assert_close(out[0].cpu(), want[0].cpu(), **TOL)
    torch.testing.assert_close(out[1].cpu(), want[1].cpu())
    assert "aoti_torch_flagos_mm" in code, code[:2000]
    assert "cached_torch_device_type_privateuse1" in code


def test_cpp_wrapper_fallbacks_go_through_flagos_routing(cpp_wrapper_run):
    fn, args, _, _ = cpp_wrapper_run
    backend = "cuda" if ON_CUDA else "cpu"
    torch_fl.routing.set_route("mm", backend)
    try:
        torch_fl.routing.reset_stats()
        with inductor_config.patch(cpp_wrapper=True):
            fn(*args)
        calls = {s.op: s.calls for s in torch_fl.routing.stats()}
    finally:
        torch_fl.routing.set_route("mm", "")
    mm = {op: c for op, c in calls.items() if op.startswith("aten::mm")}
    assert mm and all(c.get(backend, 0) >= 1 for c in mm.values()), calls


def test_cpp_wrapper_trains_as_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 3)).to("flagos")
    ref = nn.Sequential(nn.Linear(12, 24), nn.GELU(), nn.LayerNorm(24), nn.Linear(24, 3)).to("flagos")
    ref.load_state_dict(model.state_dict())
    x, target = randn(6, 12, seed=3), randn(6, 3, seed=4)
    torch._dynamo.reset()
    with inductor_config.patch(cpp_wrapper=True):
        loss = F.mse_loss(torch.compile(model)(x), target)
        loss.backward()
    ref_loss = F.mse_loss(ref(x), target)
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss.cpu(), **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.device == p.device
        torch.testing.assert_close(p.grad.cpu(), q.grad.cpu(), **TOL)


# --- AOTInductor ----------------------------------------------------------------


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4 * 4, 5)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x, k):
        y = self.conv(x) + self.shift[:, None, None]
        y = F.adaptive_avg_pool2d(y, 2).flatten(1)
        top = torch.topk(y, 3).values
        return self.fc(y).softmax(-1), top, torch.nonzero(k > 0)


def _package(tmp_dir, device):
    torch.manual_seed(0)
    net = Net().to(device).eval()
    x, k = randn(2, 3, 8, 8, seed=5, device=device), randn(7, seed=6, device=device)
    batch = torch.export.Dim("batch", min=1, max=16)
    program = torch.export.export(net, (x, k), dynamic_shapes=({0: batch}, None))
    path = torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(tmp_dir, "net.pt2"))
    return net, path


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return _package(str(tmp_path_factory.mktemp("aoti")), "flagos")


def _assert_matches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == w.device, (g.device, w.device)
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.cpu(), w.cpu(), **TOL)


def test_aoti_package_records_flagos_and_runs_as_eager(package):
    net, path = package
    with zipfile.ZipFile(path) as archive:
        metadata = [n for n in archive.namelist() if n.endswith("_metadata.json")]
        assert metadata, archive.namelist()
        assert json.loads(archive.read(metadata[0]))["AOTI_DEVICE_KEY"] == "flagos"
    compiled = torch._inductor.aoti_load_package(path)
    k = randn(7, seed=8)
    for batch in (2, 5):  # the batch dimension is dynamic
        x = randn(batch, 3, 8, 8, seed=batch)
        with torch.no_grad():
            _assert_matches(compiled(x, k), net(x, k))


def test_aoti_weights_are_flagos_tensors_and_can_be_replaced(package):
    net, path = package
    net = copy.deepcopy(net)  # the fixture's module stays as packaged
    compiled = torch._inductor.aoti_load_package(path)
    fqns = compiled.get_constant_fqns()
    assert "fc.weight" in fqns, fqns
    new_weight = randn(*net.fc.weight.shape, seed=9)
    compiled.load_constants({"fc.weight": new_weight}, check_full_update=False)
    x, k = randn(3, 3, 8, 8, seed=10), randn(7, seed=11)
    with torch.no_grad():
        net.fc.weight.copy_(new_weight)
        _assert_matches(compiled(x, k), net(x, k))


_FRESH_PROCESS = """
import torch, torch_fl
compiled = torch._inductor.aoti_load_package({path!r})
x, k, want = torch.load({inputs!r})
got = compiled(x.to("flagos"), k.to("flagos"))
assert all(g.device.type == "flagos" for g in got), [g.device for g in got]
for g, w in zip(got, want):
    torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-5)
print("loaded and ran", len(got))
"""


def test_aoti_package_loads_in_a_fresh_process(package, tmp_path, run_py):
    net, path = package
    x, k = randn(4, 3, 8, 8, seed=12), randn(7, seed=13)
    with torch.no_grad():
        want = [t.cpu() for t in net(x, k)]
    inputs = str(tmp_path / "inputs.pt")
    torch.save((x.cpu(), k.cpu(), want), inputs)
    rc, out, err = run_py(_FRESH_PROCESS.format(path=path, inputs=inputs))
    assert rc == 0, err[-3000:]
    assert "loaded and ran 3" in out


def test_aoti_package_for_the_second_device(tmp_path):
    net, path = _package(str(tmp_path), "flagos:1")
    assert torch.flagos.current_device() == 0
    compiled = torch._inductor.aoti_load_package(path, device_index=1)
    x, k = randn(3, 3, 8, 8, seed=14, device="flagos:1"), randn(7, seed=15, device="flagos:1")
    with torch.no_grad():
        got = compiled(x, k)
        _assert_matches(got, net(x, k))
    assert all(g.device == torch.device("flagos:1") for g in got)
    # New weights while another device is current: the model makes them on its own.
    new_weight = randn(*net.fc.weight.shape, seed=16, device="flagos:1")
    compiled.load_constants({"fc.weight": new_weight}, check_full_update=False)
    with torch.no_grad():
        net.fc.weight.copy_(new_weight)
        _assert_matches(compiled(x, k), net(x, k))


def test_aoti_package_runs_when_the_compiler_links_its_cxx_runtime_statically(tmp_path):
    # As the GCC under /opt/gcc on the GPU machines: it has libstdc++ as a
    # static archive only. A library linked so carries a private copy of the
    # standard library that mixes with the process's, and AOTInductor's model
    # constructor fails in std::regex (native CPU and CUDA packages do).
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch_fl.compile import cpp_wrapper

    assert cpp_wrapper._cxx_runtime() is not None  # else the build below proves nothing
    compiler = tmp_path / "static-cxx"
    compiler.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) exec %s "$@" -static-libstdc++ ;; esac\n'
                        'exec %s "$@"\n' % (get_cpp_compiler(), get_cpp_compiler()))
    compiler.chmod(0o755)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU()).to("flagos").eval()
    x = randn(3, 8, seed=17)
    with inductor_config.patch({"cpp.cxx": (str(compiler),), "force_disable_caches": True}):
        path = torch._inductor.aoti_compile_and_package(
            torch.export.export(net, (x,)), package_path=str(tmp_path / "static.pt2"))
    compiled = torch._inductor.aoti_load_package(path)
    with torch.no_grad():
        _assert_matches([compiled(x)], [net(x)])


def test_cpp_wrapper_failure_is_reported_by_name(monkeypatch):
    from torch_fl.compile import cpp_wrapper

    monkeypatch.setattr(cpp_wrapper, "_unavailable", "OSError: libtorch_fl_aoti.so: cannot open")
    with pytest.raises(RuntimeError, match=r"cpp_wrapper=True, AOTInductor\) cannot run on flagos.*"
                                            r"libtorch_fl_aoti\.so: cannot open"):
        cpp_wrapper.check_available()
