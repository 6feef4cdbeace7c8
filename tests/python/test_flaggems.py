"""The flaggems provider: FlagGems' Triton kernels routed from flagos.

Marked `flaggems`: runs only where torch_fl registered FlagGems (cuda driver,
flag_gems importable). Every op is compared with native CUDA on fresh inputs.
The OpInfo sweep against CUDA (test_opinfo.py, --ref cuda) covers every
registered op that has an OpInfo, through the default routing.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from conftest import run_py

pytestmark = pytest.mark.flaggems

if not torch_fl.is_flaggems_enabled():
    pytest.skip("FlagGems is not enabled (needs the cuda driver and flag_gems)", allow_module_level=True)

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


def test_disable_flaggems_py_turns_the_provider_off():
    rc, out, err = run_py("import torch_fl; print(torch_fl.is_flaggems_enabled(), "
                          "'flaggems' in torch_fl.routing.available_backends())",
                          env={"FLAGOS_DISABLE_FLAGGEMS_PY": "1"})
    assert rc == 0, err
    assert out.strip() == "False False"


def test_unused_excludes_ops_by_aten_name():
    rc, out, err = run_py("import torch_fl; ops = torch_fl.flaggems.registered_ops(); "
                          "print('mm' in ops, 'add.Tensor' in ops)",
                          env={"FLAGOS_FLAGGEMS_UNUSED": "mm,add.Tensor"})
    assert rc == 0, err
    assert out.strip() == "False False"
