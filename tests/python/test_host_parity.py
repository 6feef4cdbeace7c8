"""Operators whose CUDA kernel accepts inputs the CPU kernel refuses, which
programs pick for every device that is not the CPU (csrc/aten/host_parity.h).

Integer `histc` (Hugging Face's MoE layers count tokens per expert with it on
any device but "cpu" and "mps"): flagos computes what CUDA's kernel does on
both drivers, checked against a plain-Python transcription of CUDA's formula.
Float `histc` stays the native kernel's.
"""

import random

import pytest
import torch

import torch_fl

INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


def cuda_histc(values, bins, lo, hi, dtype):
    """CUDA's integer histc (SummaryOps.cu), element by element: int64 bounds,
    an empty range taken from the data and widened, bin = (v - lo) * bins //
    (hi - lo) (truncating; v >= lo), v == hi in the last bin, counts wrapped to
    the input's dtype."""
    lo, hi = int(lo), int(hi)
    if lo == hi and values:
        lo, hi = min(values), max(values)
    if lo == hi:
        lo, hi = lo - 1, hi + 1
    counts = [0] * bins
    for v in values:
        if lo <= v <= hi:
            counts[min((v - lo) * bins // (hi - lo), bins - 1)] += 1
    return torch.tensor(counts, dtype=torch.int64).to(dtype)


def draw(dtype, n, seed):
    info = torch.iinfo(dtype)
    low, high = max(info.min, -40), min(info.max, 40)
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high + 1, (n,), generator=g, dtype=torch.int64).to(dtype)


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@pytest.mark.parametrize("bins,lo,hi", [
    (8, 0, 7),        # tokens per expert, as Hugging Face asks
    (5, -10, 25),     # values on both sides of the range are ignored
    (13, 0, 0),       # range from the data
    (3, 1.7, 9.2),    # fractional bounds truncate to integers, as CUDA's do
    (1, -3, 3),
])
def test_integer_histc_counts_as_cuda_does(dtype, bins, lo, hi):
    seed = random.randrange(1 << 30)
    x = draw(dtype, 97, seed)
    got = torch.histc(x.to("flagos"), bins=bins, min=lo, max=hi)
    assert got.device.type == "flagos" and got.dtype == dtype
    want = cuda_histc(x.tolist(), bins, lo, hi, dtype)
    assert torch.equal(got.cpu(), want), f"seed {seed}"


def test_integer_histc_of_a_constant_or_empty_input_widens_the_range():
    const = torch.full((6,), 4, dtype=torch.int32)
    got = torch.histc(const.to("flagos"), bins=4)  # range [3, 5]
    assert torch.equal(got.cpu(), cuda_histc(const.tolist(), 4, 0, 0, torch.int32))
    empty = torch.empty(0, dtype=torch.int64, device="flagos")
    assert torch.equal(torch.histc(empty, bins=3).cpu(), torch.zeros(3, dtype=torch.int64))


def test_integer_histc_of_a_strided_view():
    x = draw(torch.int32, 60, 3).reshape(6, 10)
    view = x.to("flagos").t()[::2]
    got = torch.histc(view, bins=6, min=-20, max=20)
    assert torch.equal(got.cpu(), cuda_histc(x.t()[::2].reshape(-1).tolist(), 6, -20, 20, torch.int32))


def test_integer_histc_out_resizes_and_converts():
    x = draw(torch.int64, 50, 5)
    want = cuda_histc(x.tolist(), 7, -30, 30, torch.int64)
    out = torch.empty(3, dtype=torch.float32, device="flagos")
    with pytest.warns(UserWarning, match="resized"):
        res = torch.histc(x.to("flagos"), bins=7, min=-30, max=30, out=out)
    assert res is out and out.shape == (7,) and out.dtype == torch.float32
    assert torch.equal(out.cpu(), want.float())


def test_integer_histc_errors_name_the_argument():
    x = torch.arange(5, dtype=torch.int32, device="flagos")
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x, bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x, bins=3, min=5, max=2)


@pytest.mark.host_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_float_histc_is_the_cpu_kernel(dtype):
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    x = torch.randn(500, generator=g, dtype=dtype)
    for bins, lo, hi in ((10, -2.0, 2.0), (7, 0, 0)):
        got = torch.histc(x.to("flagos"), bins=bins, min=lo, max=hi)
        assert torch.equal(got.cpu(), torch.histc(x, bins=bins, min=lo, max=hi))


def test_histc_is_counted_on_its_route():
    torch_fl.routing.reset_stats()
    torch.histc(torch.arange(9, dtype=torch.int32, device="flagos"), bins=3)
    torch.histc(torch.rand(9, device="flagos"), bins=3)
    calls = {s.op: s.calls for s in torch_fl.routing.stats()}
    assert sum(calls["aten::histc"].values()) == 2


@pytest.mark.host_only
def test_mixture_of_experts_model_matches_the_cpu():
    """Mixtral's expert layer (transformers' grouped MoE path) takes the integer
    histc on flagos and the float one on the CPU: same loss, logits, gradients
    and greedy tokens."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.MixtralConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, num_local_experts=4, num_experts_per_tok=2,
        pad_token_id=0)
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    ids = torch.randint(0, 300, (2, 12), generator=g)
    runs = {}
    for dev in ("cpu", "flagos"):
        torch.manual_seed(0)
        model = transformers.MixtralForCausalLM(cfg).to(dev).eval()
        out = model(input_ids=ids.to(dev), labels=ids.to(dev))
        out.loss.backward()
        grads = [p.grad.cpu() for p in model.parameters() if p.grad is not None]
        tokens = model.generate(input_ids=ids.to(dev), attention_mask=torch.ones_like(ids).to(dev),
                                max_new_tokens=4, do_sample=False)
        runs[dev] = (out.logits.detach().cpu(), grads, tokens.cpu())
    (cl, cg, ct), (fl, fg, ft) = runs["cpu"], runs["flagos"]
    assert torch.equal(cl, fl) and torch.equal(ct, ft)
    assert len(cg) == len(fg) and all(torch.equal(a, b) for a, b in zip(cg, fg))
