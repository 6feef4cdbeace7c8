"""Shadow verification (FLAGOS_VERIFY, torch_fl.verify).

On the host driver the routed kernels and the reference are the same CPU
kernels, so a divergence needs a deliberately wrong kernel: the tests register
one as a Python kernel of the flaggems provider (the path FlagGems' kernels
take on the cuda driver), which the default route then sends the operator to.
"""

import pytest
import torch

import torch_fl

from conftest import python_kernels

pytestmark = pytest.mark.host_only  # replaces the Python kernels (FlagGems' on the cuda driver)

DEV = "flagos"


@pytest.fixture(autouse=True)
def clean_records():
    torch_fl.verify.reset()
    yield
    torch_fl.verify.use_environment()
    torch_fl.verify.reset()


def wrong_tanh(x):
    return torch.tanh(x) + 0.25


def test_wrong_kernel_is_flagged_and_named():
    x = torch.randn(4, 8, device=DEV)
    with python_kernels({"tanh": wrong_tanh}), torch_fl.verify.verifying("1"):
        y = torch.tanh(x)
        z = torch.tanh(x[:, :3])  # a second, strided signature
    # The workload's own result is the routed kernel's, wrong as it is.
    torch.testing.assert_close(y.cpu(), torch.tanh(x.cpu()) + 0.25)
    assert z.shape == (4, 3)
    bad = torch_fl.verify.diverging()
    assert [(r.op, r.backend) for r in bad] == [("aten::tanh", "flaggems")]
    r = bad[0]
    assert (r.compared, r.failed) == (2, 2)
    assert r.max_abs == pytest.approx(0.25, rel=1e-5)
    assert r.first_failure_call == "tanh(f32[4, 8])"
    assert "result 0: 32 of 32 elements differ" in r.first_failure
    text = torch_fl.verify.summary()
    assert "aten::tanh on flaggems: 2 of 2 calls diverge" in text
    # Routed to the reference kernels, the same op verifies clean.
    torch_fl.verify.reset()
    with torch_fl.verify.verifying("1"):
        torch.tanh(x)
    (rec,) = [r for r in torch_fl.verify.records() if r.op == "aten::tanh"]
    assert (rec.backend, rec.compared, rec.failed, rec.max_abs) == ("native", 1, 0, 0.0)


def test_error_mode_raises_naming_operator_backend_and_error():
    x = torch.randn(16, device=DEV)
    with python_kernels({"tanh": wrong_tanh}), torch_fl.verify.verifying("error"):
        torch.sigmoid(x)  # correct: no error
        with pytest.raises(RuntimeError) as info:
            torch.tanh(x)
    msg = str(info.value)
    assert "aten::tanh" in msg and "'flaggems'" in msg and "max abs error 0.25" in msg
    assert "tanh(f32[16])" in msg and "FLAGOS_VERIFY=1" in msg


def test_written_argument_of_a_wrong_inplace_kernel_is_flagged():
    def wrong_mul_(self, other):
        return self.mul_(other).add_(1)  # in place, as the schema says, but wrong

    a = torch.randn(8, device=DEV)
    b = torch.randn(8, device=DEV)
    with python_kernels({"mul_.Tensor": wrong_mul_}), torch_fl.verify.verifying("1"):
        a.mul_(b)
    (r,) = torch_fl.verify.diverging()
    assert (r.op, r.backend) == ("aten::mul_.Tensor", "flaggems")
    assert "result 0" in r.first_failure or "argument 'self'" in r.first_failure


def test_inplace_out_and_views_keep_their_semantics_under_verification():
    g = torch.Generator().manual_seed(0)
    cpu = {k: torch.randn(6, 5, generator=g) for k in "abc"}
    dev = {k: v.to(DEV) for k, v in cpu.items()}

    def workload(t, device):
        a, b, c = t["a"].clone(), t["b"].clone(), t["c"].clone()
        out = torch.empty(0, device=device)
        r_out = torch.add(a, b, alpha=2, out=out)  # out= resized by the kernel
        a.mul_(b)  # in place
        row = c[2]  # a view: writes reach c
        row.add_(10)
        torch.add(a, a, out=a)  # out= aliases the inputs
        s = c.t().contiguous().sum(0)
        idx = torch.tensor([0, 2, 2], device=device)
        acc = torch.zeros(6, 5, device=device).index_put_((idx,), b[:3], accumulate=True)
        return out, r_out is out, a, c, s, acc

    expected = workload(cpu, "cpu")
    with torch_fl.verify.verifying("error"):
        got = workload(dev, DEV)
    assert got[1] is True
    for e, o in zip(expected, got):
        if isinstance(e, torch.Tensor):
            assert o.device.type == "flagos"
            torch.testing.assert_close(o.cpu(), e, rtol=0, atol=0)
    recs = {r.op: r for r in torch_fl.verify.records()}
    for op in ("aten::add.out", "aten::mul_.Tensor", "aten::add_.Tensor",
               "aten::_index_put_impl_", "aten::sum.dim_IntList"):
        assert recs[op].compared >= 1 and recs[op].failed == 0, recs[op]
    assert not torch_fl.verify.diverging()


def test_random_ops_are_not_run_twice():
    torch.manual_seed(123)
    want = torch.randn(100, device=DEV), torch.rand(7, device=DEV).bernoulli_(0.5)
    torch.manual_seed(123)
    with torch_fl.verify.verifying("error"):
        got = torch.randn(100, device=DEV), torch.rand(7, device=DEV).bernoulli_(0.5)
    for w, g in zip(want, got):
        torch.testing.assert_close(g.cpu(), w.cpu(), rtol=0, atol=0)
    skipped = [r for r in torch_fl.verify.records() if r.skipped]
    assert skipped and all("random" in r.skip_reason for r in skipped)
    assert all(r.compared == 0 for r in skipped)


def test_tolerance_per_dtype_and_override():
    assert torch_fl.verify.tolerance(torch.float32) == (1.3e-5, 1e-5)
    assert torch_fl.verify.tolerance(torch.bfloat16) == (1.6e-2, 1e-2)
    assert torch_fl.verify.tolerance(torch.int64) == (0.0, 0.0)

    def off_by_a_little(x):
        return torch.tanh(x) * (1 + 1e-3)

    x = torch.randn(64, device=DEV)
    try:
        with python_kernels({"tanh": off_by_a_little}), torch_fl.verify.verifying("1"):
            torch.tanh(x)
            assert [r.op for r in torch_fl.verify.diverging()] == ["aten::tanh"]
            torch_fl.verify.reset()
            torch_fl.verify.set_tolerance(torch.float32, rtol=2e-3, atol=1e-5)
            torch.tanh(x)
            assert not torch_fl.verify.diverging()
    finally:
        torch_fl.verify.reset_tolerances()
    assert torch_fl.verify.tolerance(torch.float32) == (1.3e-5, 1e-5)
    with pytest.raises(ValueError, match="not a floating dtype"):
        torch_fl.verify.set_tolerance(torch.int32, 0.1, 0.1)
    with pytest.raises(ValueError, match="not valid"):
        torch_fl.verify.enable("yes")


def test_env_report_at_exit_and_error_mode_and_bad_value(start_py):
    code = """
import torch, torch_fl
from torch_fl import _C
_C._register_python_kernel('tanh', lambda x: torch.tanh(x) + 0.25)
torch_fl.routing.reload()
x = torch.randn(4, 8, device='flagos')
y = torch.tanh(x) + torch.sigmoid(x)
print('mode', torch_fl.verify.mode(), len(torch_fl.verify.diverging()))
"""
    report = start_py(code, env={"FLAGOS_VERIFY": "1"})
    error = start_py(code, env={"FLAGOS_VERIFY": "error"})
    bad = start_py("import torch_fl", env={"FLAGOS_VERIFY": "yes"})
    rc, out, err = report.result()
    assert rc == 0, err
    assert "mode 1 1" in out
    assert "flagos verify:" in err and "aten::tanh on flaggems: 1 of 1 calls diverge" in err
    rc, out, err = error.result()
    assert rc != 0 and "flagos verify: aten::tanh on backend 'flaggems' diverges" in err
    rc, out, err = bad.result()
    assert rc != 0
    assert "FLAGOS_VERIFY='yes' is not valid: use 1" in err and "error" in err and "0 (off" in err
