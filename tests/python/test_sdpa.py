"""Fused scaled-dot-product attention on flagos (csrc/aten/attention.cpp).

cuda driver (marked ``cuda``): F.scaled_dot_product_attention on flagos picks
the kernel native CUDA picks under the same torch.nn.attention.sdpa_kernel
setting (flash, memory-efficient, cuDNN, math; forward and backward), and its
outputs and gradients are bit-equal to CUDA's, seeded dropout included. The
CUDA reference runs in one child process without torch_fl (sdpa_cases.py).

host driver: flagos keeps the CPU's choice, with the CPU's numbers.
"""

import os

import pytest
import torch
import torch.nn.functional as F

import torch_fl
from sdpa_cases import CUDA_CASES, HOST_CASES, run_case


@pytest.fixture
def cuda_kernels():
    """Every operator on PyTorch's CUDA kernels, whether or not FlagGems is on:
    bit-equality with native CUDA is the claim."""
    torch_fl.routing.set_route("*", "cuda")
    yield
    torch_fl.routing.set_route("*", "")


@pytest.fixture(scope="module")
def cuda_reference(tmp_path_factory, run_py):
    path = tmp_path_factory.mktemp("sdpa") / "cuda.pt"
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys; sys.path.insert(0, {here!r}); import sdpa_cases; "
            f"sdpa_cases.run_all('cuda', sdpa_cases.CUDA_CASES, {str(path)!r})")
    rc, out, err = run_py(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, timeout=600)
    assert rc == 0, f"the CUDA reference failed:\n{out[-3000:]}\n{err[-3000:]}"
    return torch.load(path)


def assert_same_result(got, ref, where):
    if "error" in ref:
        assert "error" in got, f"{where}: the reference refused ({ref['message']}), flagos ran {got.get('kernels')}"
        assert got["error"] == ref["error"] and ref["message"] in got["message"], (
            f"{where}: reference {ref['error']}: {ref['message']}\nflagos {got['error']}: {got['message']}")
        return
    assert "error" not in got, f"{where}: flagos raised {got['error']}: {got['message']}"
    assert got["kernels"] == ref["kernels"], f"{where}: flagos ran {got['kernels']}, the reference {ref['kernels']}"
    assert sorted(k for k in got if k != "kernels") == sorted(k for k in ref if k != "kernels"), where
    for key in ref:
        if key == "kernels":
            continue
        a, b = got[key], ref[key]
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {key} {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if not torch.equal(a, b):
            diff = (a.double() - b.double()).abs()
            pytest.fail(f"{where}: {key} is not bit-equal: {int((diff > 0).sum())} of {a.numel()} elements "
                        f"differ, max |diff| {diff.max().item():.3g} (kernels {ref['kernels']})")


@pytest.mark.cuda
@pytest.mark.parametrize("case", CUDA_CASES, ids=[c["id"] for c in CUDA_CASES])
def test_sdpa_matches_native_cuda_bit_for_bit(case, cuda_reference, cuda_kernels):
    assert_same_result(run_case(case, "flagos"), cuda_reference[case["id"]], case["id"])


@pytest.mark.cuda
def test_fused_sdpa_is_what_cuda_picks_by_default(cuda_reference):
    # A default bf16 call on an H100 is fused (flash or cuDNN), never math:
    # the point of the feature. (Which one is CUDA's choice, compared above.)
    kernels = cuda_reference["default"]["kernels"]
    assert not any("math" in k for k in kernels), kernels


@pytest.mark.host_only
@pytest.mark.parametrize("case", HOST_CASES, ids=[c["id"] for c in HOST_CASES])
def test_host_driver_keeps_cpu_choice_and_numbers(case):
    assert_same_result(run_case(case, "flagos"), run_case(case, "cpu"), case["id"])


@pytest.mark.host_only
def test_overrideable_operator_is_for_the_cuda_driver_only():
    q = torch.randn(1, 2, 8, 16, device="flagos")
    with pytest.raises(RuntimeError, match="cuda driver only.*host driver"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, q, q)


@pytest.mark.parametrize("causal", [False, True])
def test_choice_under_fake_tensors_uses_metadata_only(causal):
    # torch.compile traces SDPA on FakeTensors: the choice must come from
    # metadata (no memory, no real kernels), on every driver.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 64, 32, device="flagos", dtype=torch.bfloat16, requires_grad=True)
        k = torch.empty(2, 4, 64, 32, device="flagos", dtype=torch.bfloat16, requires_grad=True)
        out = F.scaled_dot_product_attention(q, k, k, is_causal=causal)
        assert out.shape == (2, 4, 64, 32) and out.device.type == "flagos"
        out.sum().backward()
        assert q.grad.shape == q.shape
