"""The flaggems provider: FlagGems' Triton kernels routed from flagos.

Marked `flaggems`: runs only where torch_fl registered FlagGems (cuda driver,
flag_gems importable). Every op is compared with native CUDA on fresh inputs.
The OpInfo sweep against CUDA (test_opinfo.py, --ref cuda) covers every
registered op that has an OpInfo, through the default routing.
"""

import os
import random

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from conftest import run_py

pytestmark = pytest.mark.flaggems

if not torch_fl.is_flaggems_enabled():
    pytest.skip("FlagGems is not enabled (needs the cuda driver and flag_gems)", allow_module_level=True)

# Samples per OpInfo and dtype in the sweep (the first ones of each).
SWEEP_SAMPLES = 8

TOL = {torch.float32: dict(rtol=1.3e-6 * 10, atol=1e-5),
       torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
       torch.float16: dict(rtol=1e-3, atol=1e-3)}

CASES = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "mm": lambda a, b: a @ b.T,
    "softmax": lambda a, b: F.softmax(a, -1),
    "layer_norm": lambda a, b: F.layer_norm(a, (a.shape[-1],)),
    "silu": lambda a, b: F.silu(a),
    "sum": lambda a, b: a.sum(-1),
    "rsqrt": lambda a, b: torch.rsqrt(a.abs() + 1),
    "cat": lambda a, b: torch.cat([a, b], 0),
    "embedding": lambda a, b: F.embedding(torch.randint(0, a.shape[0], (17,), device=a.device), a),
}


def test_flaggems_serves_the_default_route():
    ops = torch_fl.flaggems.registered_ops()
    assert len(ops) > 50, ops
    assert "flaggems" in torch_fl.routing.available_backends()
    x = torch.randn(64, 64, device="flagos")
    torch.nn.functional.silu(x)
    rows = [r for r in torch_fl.routing.table("silu") if r.resolved]
    assert rows and rows[0].backend == "flaggems", rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", sorted(CASES))
def test_flaggems_kernels_match_native_cuda(case, dtype):
    a = torch.randn(48, 96, dtype=dtype)
    b = torch.randn(48, 96, dtype=dtype)
    torch_fl.routing.reset_stats()
    got = CASES[case](a.to("flagos"), b.to("flagos"))
    ref = CASES[case](a.cuda(), b.cuda()) if case != "embedding" else None
    if case == "embedding":  # same indices on both sides
        idx = torch.randint(0, 48, (17,))
        got = F.embedding(idx.to("flagos"), a.to("flagos"))
        ref = F.embedding(idx.cuda(), a.cuda())
    torch.testing.assert_close(got.cpu(), ref.cpu(), **TOL[dtype])


@pytest.mark.parametrize("shape", [(2, 12, 32), (3, 4, 5, 16)])
def test_layer_norm_gradients_over_batched_inputs(shape):
    """FlagGems' native_layer_norm_backward normalizes over everything after the
    first dimension (excluded): gradients of a 3-d and a 4-d LayerNorm, as
    every transformer has, against the CPU in float64."""
    g = torch.Generator().manual_seed(sum(shape))
    x, w, b, dy = (torch.randn(s, generator=g, dtype=torch.float64)
                   for s in (shape, shape[-1:], shape[-1:], shape))

    def grads(device, dtype):
        args = [t.to(device, dtype).requires_grad_() for t in (x, w, b)]
        F.layer_norm(args[0], shape[-1:], args[1], args[2]).backward(dy.to(device, dtype))
        return [a.grad.cpu().double() for a in args]

    for got, ref in zip(grads("flagos", torch.float32), grads("cpu", torch.float64)):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_indexing_with_negative_indices():
    """FlagGems' index and index_put mask negative indices out (excluded):
    reads from the end and writes to it, against the CPU."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 12, 6, 8, generator=g)
    cols = torch.tensor([-1, 0, -6, 3])  # dim 2 has 6 entries
    rows = torch.tensor([-1, 0])  # dim 0 has 2
    xf = x.to("flagos")
    torch.testing.assert_close(xf[:, :, cols.to("flagos")].cpu(), x[:, :, cols], rtol=0, atol=0)
    torch.testing.assert_close(xf[rows.to("flagos")].cpu(), x[rows], rtol=0, atol=0)
    v = torch.randn(2, 12, 6, 8, generator=g)
    y, yf = x.clone(), xf.clone()
    y[rows] = v
    yf[rows.to("flagos")] = v.to("flagos")
    torch.testing.assert_close(yf.cpu(), y, rtol=0, atol=0)
    twice = torch.tensor([-1, 1, 0])  # -1 and 1 are one row: accumulated twice
    w = torch.randn(3, 12, 6, 8, generator=g)
    y.index_put_((twice,), w, accumulate=True)
    yf.index_put_((twice.to("flagos"),), w.to("flagos"), accumulate=True)
    torch.testing.assert_close(yf.cpu(), y, rtol=1e-6, atol=1e-6)


def test_deterministic_algorithms_run_cuda_kernels():
    """torch.use_deterministic_algorithms(True): calls FlagGems would serve run
    CUDA's kernels, so results are CUDA's bits, and an operator CUDA refuses
    in that mode (index_add_ alerts on CUDA) is refused the same way."""
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(64, 96, generator=g), torch.randn(64, 96, generator=g)
    idx = torch.randint(0, 64, (40,), generator=g)
    fns = {"silu": lambda x, y, i: F.silu(x), "softmax": lambda x, y, i: F.softmax(x, -1),
           "mm": lambda x, y, i: x @ y.T, "add": lambda x, y, i: x + y,
           "index_add_": lambda x, y, i: x.clone().index_add_(0, i, y[:40])}

    def run(device, name):
        try:
            return fns[name](a.to(device), b.to(device), idx.to(device)).cpu()
        except RuntimeError as e:
            return e

    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        for name in fns:
            torch_fl.routing.reset_stats()
            got, ref = run("flagos", name), run("cuda", name)
            served = {s.op: dict(s.calls) for s in torch_fl.routing.stats()}
            if isinstance(ref, RuntimeError):
                assert isinstance(got, RuntimeError), (name, got)
                assert "deterministic" in str(got), got
            else:
                torch.testing.assert_close(got, ref, rtol=0, atol=0, msg=name)
            assert not any(torch_fl.routing.flaggems_calls(c) for c in served.values()), served
    finally:
        torch.use_deterministic_algorithms(was)


def test_disable_flaggems_py_turns_the_python_provider_off():
    """Stub-only mode (spec): no Python kernel; FlagGems serves only the operators
    launched from C++ (docs/flaggems_cpp.md)."""
    rc, out, err = run_py("import torch_fl; f = torch_fl.flaggems; "
                          "print(len(f.registered_ops()), bool(f.cpp_ops()), "
                          "torch_fl.is_flaggems_enabled() == bool(f.cpp_ops()), "
                          "('flaggems' in torch_fl.routing.available_backends()) == bool(f.cpp_ops()))",
                          env={"FLAGOS_DISABLE_FLAGGEMS_PY": "1"})
    assert rc == 0, err
    assert out.strip() == "0 True True True", out


def test_unused_excludes_ops_by_aten_name():
    rc, out, err = run_py("import torch_fl; ops = torch_fl.flaggems.registered_ops(); "
                          "print('mm' in ops, 'add.Tensor' in ops)",
                          env={"FLAGOS_FLAGGEMS_UNUSED": "mm,add.Tensor"})
    assert rc == 0, err
    assert out.strip() == "False False"


@pytest.mark.slow
@pytest.mark.parametrize("variants", [("function",), ("inplace", "out")], ids="+".join)
def test_every_flaggems_operator_against_native_cuda(capsys, variants):
    """Every OpInfo sample in float32, bfloat16 and float16 (up to SWEEP_SAMPLES
    per op and dtype), run with FlagGems serving its operators and compared with
    native CUDA; a failure is traced to the FlagGems operator(s) that cause it.
    The function form forward and backward; the in-place and out= forms
    forward. Fresh inputs each run: the seed is printed (set FLAGOS_SWEEP_SEED
    to reproduce). With FLAGOS_REPORT_DIR set, the pass table is written there
    (docs/flaggems.md holds the last one)."""
    import opinfo_sweep

    seed = int(os.environ.get("FLAGOS_SWEEP_SEED") or random.SystemRandom().randrange(1, 1 << 31))
    res = opinfo_sweep.run_sweep(ref="cuda", provider="flaggems", dtypes=opinfo_sweep.DTYPES,
                                 max_samples=SWEEP_SAMPLES, seed=seed, variants=variants)
    registered = torch_fl.flaggems.registered_ops()
    table = res.gems_table(registered, opinfo_sweep.DTYPES)
    lines = [f"seed {seed}", res.summary(), *res.gems_report(registered, per_op=2)]
    report = os.environ.get("FLAGOS_REPORT_DIR")
    if report:
        with open(os.path.join(report, f"flaggems_opinfo_{'_'.join(variants)}.md"), "w") as f:
            f.write("\n".join(lines) + f"\n\n{table}\n")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    failed = res.gems_failed_ops()
    assert res.crashes == 0, res.summary()
    assert not failed, ("FlagGems operators that differ from native CUDA (exclude them in "
                        "torch_fl/flaggems.py EXCLUDED, with the reason): " + ", ".join(failed))
