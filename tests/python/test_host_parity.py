"""Operators whose CUDA kernel accepts inputs the CPU kernel refuses, which
programs pick for every device that is not the CPU (csrc/aten/host_parity.h).

Integer `histc` (Hugging Face's MoE layers count tokens per expert with it on
any device but "cpu" and "mps"): flagos computes what CUDA's kernel does on
both drivers, checked against a plain-Python transcription of CUDA's formula.
Float `histc` stays the native kernel's.

SyncBatchNorm's operators (``batch_norm_stats`` and friends), which only
CUDA implements: on the host driver flagos computes them from ATen operators.
Checked on both drivers against float64 references: the statistics of the
whole batch, and autograd's gradient of ``batch_norm``.
"""

import random
import re
import warnings

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


@pytest.mark.host_only
@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64, torch.bool], ids=str)
def test_histc_of_an_integer_type_cuda_lacks_is_refused_as_on_the_cpu(dtype):
    # CUDA's kernel takes the AT_DISPATCH_ALL_TYPES integers only; the CPU's
    # kernel refuses these too, with its own words.
    x = torch.tensor([0, 1, 1, 3]).to(dtype)
    with pytest.raises((RuntimeError, NotImplementedError)) as want:
        torch.histc(x, bins=4, min=0, max=3)
    with pytest.raises(type(want.value), match=re.escape(str(want.value).splitlines()[0][:40])):
        torch.histc(x.to("flagos"), bins=4, min=0, max=3)


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


# --- SyncBatchNorm's operators ----------------------------------------------------------

TOL32 = dict(rtol=1e-5, atol=1e-5)


def bn_input(seed, shape=(6, 5, 7), dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2 + 0.5).to(dtype)


def stats64(x, dims=(0, 2)):
    x = x.double()
    return x.mean(dims), x.var(dims, correction=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_batch_norm_stats_are_the_batch_statistics(dtype):
    x = bn_input(random.randrange(1 << 30), dtype=dtype)
    mean, invstd = torch.batch_norm_stats(x.to("flagos"), 1e-5)
    assert mean.device.type == "flagos" and mean.dtype == torch.float32  # float for half inputs
    m, v = stats64(x)
    torch.testing.assert_close(mean.cpu().double(), m, **TOL32)
    torch.testing.assert_close(invstd.cpu().double(), (v + 1e-5).rsqrt(), **TOL32)


def test_batch_norm_stats_of_a_constant_channel_without_eps_is_zero():
    x = bn_input(1)
    x[:, 2] = 3.0
    _, invstd = torch.batch_norm_stats(x.to("flagos"), 0.0)
    assert invstd[2].item() == 0.0 and torch.isfinite(invstd.cpu()).all()


def test_gathered_statistics_are_those_of_the_whole_batch():
    x = bn_input(random.randrange(1 << 30), shape=(12, 5, 3))
    parts = [x[:4], x[4:6], x[6:]]  # replicas with 4, 2 and 6 samples
    stats = [torch.batch_norm_stats(p.to("flagos"), 1e-5) for p in parts]
    counts = torch.tensor([p.shape[0] * p.shape[2] for p in parts], dtype=torch.float32)
    rm, rv = torch.rand(5), torch.rand(5) + 0.5
    running_mean, running_var = rm.to("flagos"), rv.to("flagos")
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        x.to("flagos"), torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats]),
        running_mean, running_var, 0.1, 1e-5, counts.to("flagos"))
    m, v = stats64(x)
    n = counts.sum().double()
    torch.testing.assert_close(mean.cpu().double(), m, **TOL32)
    torch.testing.assert_close(invstd.cpu().double(), (v + 1e-5).rsqrt(), **TOL32)
    torch.testing.assert_close(running_mean.cpu().double(), 0.9 * rm.double() + 0.1 * m, **TOL32)
    torch.testing.assert_close(running_var.cpu().double(),
                               0.9 * rv.double() + 0.1 * v * n / (n - 1), **TOL32)


def test_gather_stats_with_one_count_for_every_replica():
    x = bn_input(random.randrange(1 << 30), shape=(8, 5, 3))
    stats = [torch.batch_norm_stats(p.to("flagos"), 1e-5) for p in (x[:4], x[4:])]
    mean, invstd = torch.batch_norm_gather_stats(
        x.to("flagos"), torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats]),
        None, None, 0.1, 1e-5, 12)
    m, v = stats64(x)
    torch.testing.assert_close(mean.cpu().double(), m, **TOL32)
    torch.testing.assert_close(invstd.cpu().double(), (v + 1e-5).rsqrt(), **TOL32)


@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_elemt_normalises(affine):
    x = bn_input(random.randrange(1 << 30))
    w, b = (torch.rand(5) + 0.5, torch.randn(5)) if affine else (None, None)
    on = (lambda t: None if t is None else t.to("flagos"))
    mean, invstd = torch.batch_norm_stats(x.to("flagos"), 1e-5)
    got = torch.batch_norm_elemt(x.to("flagos"), on(w), on(b), mean, invstd, 1e-5)
    f64 = (lambda t: None if t is None else t.double())
    want = torch.nn.functional.batch_norm(x.double(), None, None, f64(w), f64(b), training=True,
                                          eps=1e-5)
    assert got.dtype == x.dtype
    torch.testing.assert_close(got.cpu().double(), want, **TOL32)
    out = torch.empty(x.shape, device="flagos")
    res = torch.batch_norm_elemt(x.to("flagos"), on(w), on(b), mean, invstd, 1e-5, out=out)
    assert res is out and torch.equal(out.cpu(), got.cpu())


def test_gathered_statistics_of_no_elements_leave_the_running_mean_decaying():
    # SyncBatchNorm drops replicas with empty batches; with none left, CUDA's
    # merge yields a mean of 0, so the running mean decays instead of turning NaN.
    rm = torch.rand(5)
    running_mean = rm.to("flagos")
    empty = torch.empty(0, 5, device="flagos")
    mean, _ = torch.batch_norm_gather_stats_with_counts(
        torch.empty(0, 5, 3, device="flagos"), empty, empty, running_mean, None, 0.1, 1e-5,
        torch.empty(0, device="flagos"))
    assert torch.equal(mean.cpu(), torch.zeros(5))
    torch.testing.assert_close(running_mean.cpu(), rm * 0.9)


def test_sync_batch_norm_operators_route_to_the_host_kernels():
    # The routing table knows these operators have a kernel on the host driver:
    # no CPU-fallback warning, counted on their route.
    torch_fl.routing.reset_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.batch_norm_stats(bn_input(3).to("flagos"), 1e-5)
    calls = {s.op: s.calls for s in torch_fl.routing.stats()}
    assert sum(calls["aten::batch_norm_stats"].values()) == 1


def test_batch_norm_backward_is_autograds_gradient():
    seed = random.randrange(1 << 30)
    x, dy = bn_input(seed), bn_input(seed + 1)
    w, b = torch.rand(5) + 0.5, torch.randn(5)
    fx, fdy, fw = x.to("flagos"), dy.to("flagos"), w.to("flagos")
    mean, invstd = torch.batch_norm_stats(fx, 1e-5)
    sum_dy, sum_dy_xmu, grad_w, grad_b = torch.batch_norm_backward_reduce(
        fdy, fx, mean, invstd, fw, True, True, True)
    count = torch.tensor([x.shape[0] * x.shape[2]], dtype=torch.int32, device="flagos")
    grad_x = torch.batch_norm_backward_elemt(fdy, fx, mean, invstd, fw, sum_dy, sum_dy_xmu, count)
    # The reference: autograd through batch_norm over the same batch, in float64.
    x64, w64, b64 = (t.double().requires_grad_() for t in (x, w, b))
    torch.nn.functional.batch_norm(x64, None, None, w64, b64, training=True, eps=1e-5).backward(
        dy.double())
    torch.testing.assert_close(grad_x.cpu().double(), x64.grad, **TOL32)
    torch.testing.assert_close(grad_w.cpu().double(), w64.grad, **TOL32)
    torch.testing.assert_close(grad_b.cpu().double(), b64.grad, **TOL32)
    torch.testing.assert_close(sum_dy.cpu().double(), dy.double().sum((0, 2)), **TOL32)
    # Flags off: those results are left out (None), as CUDA's are.
    parts = torch.batch_norm_backward_reduce(fdy, fx, mean, invstd, None, True, False, False)
    assert parts[0] is not None and parts[1] is not None and parts[2] is None and parts[3] is None
