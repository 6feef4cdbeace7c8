"""Autograd, training, autocast and GradScaler on flagos, checked against CPU."""

import json
import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch_fl

# The default float32 tolerances. The host driver runs the CPU's own kernels,
# so flagos matches the CPU to rounding; the cuda driver runs CUDA's (other
# reduction orders, cuBLAS), so comparisons with the CPU allow ten times more.
RTOL, ATOL = (1e-5, 1e-6) if torch_fl.driver() == "host" else (1e-4, 1e-5)


def close(actual, expected, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(actual.detach().cpu(), expected.detach().cpu(), rtol=rtol, atol=atol)


def make_mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


# ---------------------------------------------------------------- training


@pytest.mark.parametrize("device", ["flagos:0", "flagos:1"])
def test_mlp_sgd_training_matches_cpu(device):
    cpu_model = make_mlp()
    dev_model = copy.deepcopy(cpu_model).to(device)
    for p in dev_model.parameters():
        assert p.device == torch.device(device)
    cpu_opt = torch.optim.SGD(cpu_model.parameters(), lr=0.1, momentum=0.9)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1, momentum=0.9)

    for step in range(3):
        x = torch.randn(8, 16)
        target = torch.randn(8, 4)
        cpu_opt.zero_grad()
        dev_opt.zero_grad()
        cpu_loss = F.mse_loss(cpu_model(x), target)
        dev_loss = F.mse_loss(dev_model(x.to(device)), target.to(device))
        assert dev_loss.device == torch.device(device)
        close(dev_loss, cpu_loss)
        cpu_loss.backward()
        dev_loss.backward()
        for (name, cp), dp in zip(cpu_model.named_parameters(), dev_model.parameters()):
            assert dp.grad is not None, name
            assert dp.grad.device == torch.device(device), name
            close(dp.grad, cp.grad)
        cpu_opt.step()
        dev_opt.step()
        for cp, dp in zip(cpu_model.parameters(), dev_model.parameters()):
            close(dp, cp)


def test_mse_loss_emits_no_spurious_warning():
    x, target = torch.randn(8, 4), torch.randn(8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.mse_loss(x, target)  # CPU: silent
        loss = F.mse_loss(x.to("flagos"), target.to("flagos"))
    close(loss, F.mse_loss(x, target))


def test_cross_entropy_classifier_backward_matches_cpu():
    model = make_mlp()
    dev_model = copy.deepcopy(model).to("flagos")
    x = torch.randn(10, 16)
    labels = torch.randint(0, 4, (10,))
    loss = F.cross_entropy(model(x), labels)
    dev_loss = F.cross_entropy(dev_model(x.to("flagos")), labels.to("flagos"))
    close(dev_loss, loss)
    loss.backward()
    dev_loss.backward()
    for cp, dp in zip(model.parameters(), dev_model.parameters()):
        close(dp.grad, cp.grad)


def test_adam_step_matches_cpu():
    model = make_mlp()
    dev_model = copy.deepcopy(model).to("flagos")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    dev_opt = torch.optim.Adam(dev_model.parameters(), lr=1e-2, foreach=False)
    for _ in range(2):
        x = torch.randn(4, 16)
        opt.zero_grad()
        dev_opt.zero_grad()
        model(x).pow(2).mean().backward()
        dev_model(x.to("flagos")).pow(2).mean().backward()
        opt.step()
        dev_opt.step()
    for cp, dp in zip(model.parameters(), dev_model.parameters()):
        close(dp, cp, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- views and in-place


def _grad_through(fn, x_cpu):
    x = x_cpu.clone().requires_grad_()
    fn(x).backward()
    xd = x_cpu.to("flagos").requires_grad_()
    fn(xd).backward()
    assert xd.grad.device.type == "flagos"
    close(xd.grad, x.grad)


@pytest.mark.parametrize("mask_grad", [False, True])
def test_sdpa_backward_matches_cpu_with_a_learned_mask(mask_grad):
    # A mask that requires grad (T5's position bias) rules out the fused
    # kernels, which have no derivative for it: flagos must choose as the
    # native device does, from the inputs' requires_grad too.
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 5, 8, generator=g) for _ in range(3))
    mask = torch.randn(1, 3, 5, 5, generator=g)
    grads = {}
    for dev in ("cpu", "flagos"):
        leaves = [t.clone().to(dev).requires_grad_() for t in (q, k, v)]
        m = mask.clone().to(dev).requires_grad_(mask_grad)
        out = F.scaled_dot_product_attention(*leaves, attn_mask=m)
        out.square().sum().backward()
        grads[dev] = [t.grad.cpu() for t in leaves] + ([m.grad.cpu()] if mask_grad else [])
    for got, want in zip(grads["flagos"], grads["cpu"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make", [
    lambda: nn.LSTM(6, 8, num_layers=2, batch_first=True),
    lambda: nn.LSTM(6, 8, bias=False, bidirectional=True),
    lambda: nn.GRU(6, 8, num_layers=2),
    lambda: nn.GRU(6, 8, bias=False, bidirectional=True, batch_first=True),
    lambda: nn.LSTMCell(6, 8),
    lambda: nn.GRUCell(6, 8),
], ids=["lstm", "lstm-nobias-bidir", "gru", "gru-nobias-bidir", "lstm-cell", "gru-cell"])
def test_recurrent_layers_match_cpu(make):
    # PyTorch sends PrivateUse1 tensors down its GPU RNN path, whose fused
    # cells only CUDA implements; on the host driver flagos provides them.
    torch.manual_seed(0)
    ref = make()
    got = copy.deepcopy(ref).to("flagos")
    x = torch.randn(5, 3, 6)
    if isinstance(ref, (nn.LSTMCell, nn.GRUCell)):
        x = x[0]
    def flat(out):  # output and states: (y, (h, c)), (y, h), (h, c) or h
        return [t for o in out for t in flat(o)] if isinstance(out, tuple) else [out]

    outs = {}
    for dev, m in (("cpu", ref), ("flagos", got)):
        ys = flat(m(x.to(dev).requires_grad_()))
        sum(y.square().sum() for y in ys).backward()  # every state gets a gradient
        outs[dev] = [y.detach().cpu() for y in ys] + [p.grad.cpu() for p in m.parameters()]
    for got_t, want in zip(outs["flagos"], outs["cpu"]):
        torch.testing.assert_close(got_t, want, rtol=1e-5, atol=1e-6)


def test_backward_through_views():
    x = torch.randn(6, 8)
    _grad_through(lambda t: (t.t()[2:5] * 3).sum() + t.view(-1)[::3].pow(2).sum(), x)
    _grad_through(lambda t: t.unfold(1, 3, 2).exp().mean() + t.diagonal().sum(), x)
    _grad_through(lambda t: torch.stack(t.chunk(2, 0)).tanh().sum(), x)
    _grad_through(lambda t: t.expand(3, 6, 8).sin().sum(), x)
    _grad_through(lambda t: t[torch.tensor([0, 3, 3], device=t.device)].sum(), x)


def test_backward_through_in_place_ops():
    def fn(t):
        y = t * 2
        y[:, 1].mul_(3)
        y.t()[3].add_(t[:, 0])
        y.relu_()
        return (y * y).sum()

    _grad_through(fn, torch.randn(5, 6))


def test_backward_through_in_place_on_view_of_leaf_clone():
    def fn(t):
        base = t.clone()
        view = base[1:, ::2]
        view.sigmoid_()
        return base.sum() + view.sum()

    _grad_through(fn, torch.randn(4, 6))


def test_in_place_modification_of_saved_tensor_is_detected():
    x = torch.randn(5, device="flagos", requires_grad=True)
    y = x.exp()
    z = y.sum()
    y.add_(1)  # exp saved its output
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_autograd_grad_and_second_order():
    x_cpu = torch.randn(7)
    x = x_cpu.to("flagos").requires_grad_()
    y = (x.sin() * x).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    (h,) = torch.autograd.grad(g.sum(), x)
    xc = x_cpu.clone().requires_grad_()
    yc = (xc.sin() * xc).sum()
    (gc,) = torch.autograd.grad(yc, xc, create_graph=True)
    (hc,) = torch.autograd.grad(gc.sum(), xc)
    close(g, gc)
    close(h, hc)


def test_backward_across_devices_with_to():
    x_cpu = torch.randn(4, 3)
    x = x_cpu.to("flagos:0").requires_grad_()
    y = x.to("flagos:1") * 2
    z = y.cpu().sum() + (x * 1).sum()
    z.backward()
    assert x.grad.device == torch.device("flagos", 0)
    close(x.grad, torch.full((4, 3), 3.0))


def test_no_grad_and_detach():
    x = torch.randn(3, device="flagos", requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    assert not x.detach().requires_grad
    assert x.detach().data_ptr() == x.data_ptr()


# ---------------------------------------------------------------- forward AD, checkpoint


def test_efficient_zero_tensors_keep_their_key():
    # Forward AD's tangent for a non-dual operand: no memory, the ZeroTensor
    # key sends operators to PyTorch's zero-tensor kernels.
    z = torch._efficientzerotensor(3, 2, device="flagos")
    assert z._is_zerotensor() and z.device.type == "flagos"
    x = torch.randn(3, 2, device="flagos")
    close(z + x, x.cpu())
    close(z.clone(), torch.zeros(3, 2))
    assert z.sum().item() == 0.0
    assert torch.equal(z.cpu(), torch.zeros(3, 2))


def test_forward_ad_with_non_dual_operands_matches_cpu():
    import torch.autograd.forward_ad as fwAD
    from torch.func import hessian, jacfwd, jvp

    x, t, w = (torch.randn(4, dtype=torch.float64) for _ in range(3))
    m = torch.randn(4, 3, dtype=torch.float64)
    results = {}
    for dev in ("cpu", "flagos"):
        xd, td, wd, md = (v.to(dev) for v in (x, t, w, m))
        with fwAD.dual_level():
            dual = fwAD.make_dual(xd, td)
            prod = fwAD.unpack_dual(dual * wd).tangent
            mat = fwAD.unpack_dual(dual @ md).tangent
        results[dev] = (
            prod, mat,
            jacfwd(lambda a: a * wd)(xd),
            hessian(lambda a: (a ** 3).sum())(xd),
            jvp(lambda a: torch.cat([a, wd]), (xd,), (td,))[1],
        )
    for got, want in zip(results["flagos"], results["cpu"]):
        assert got.device.type == "flagos"
        close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_recomputes_dropout_with_the_same_mask(use_reentrant):
    from torch.utils.checkpoint import checkpoint

    # torch.utils.checkpoint restores the flagos RNG state before recomputing,
    # so backward sees the forward's mask: grad = mask / (1 - p).
    x = torch.rand(2000, device="flagos").requires_grad_()
    torch.manual_seed(1234)
    y = checkpoint(lambda t: F.dropout(t, 0.5, training=True) * 1.0, x,
                   use_reentrant=use_reentrant)
    y.sum().backward()
    mask = (y.detach() != 0).to(x.dtype)
    assert 0.3 < mask.mean().item() < 0.7
    assert torch.equal(x.grad.cpu(), (mask * 2.0).cpu())


# ---------------------------------------------------------------- autocast


def test_autocast_is_available_for_flagos():
    assert torch.amp.is_autocast_available("flagos")
    assert torch.bfloat16 in torch.flagos.get_amp_supported_dtype()


def test_autocast_to_float32_keeps_autocast_on_as_cuda_does():
    # torch.autocast("cuda", dtype=torch.float32) is accepted; lower-precision
    # operators then run in float32.
    a = torch.randn(8, 8, device="flagos", dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("flagos", dtype=torch.float32):
            assert torch.is_autocast_enabled("flagos")
            out = torch.mm(a, a)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.cpu(), torch.mm(a.cpu().float(), a.cpu().float()),
                               rtol=1e-5, atol=1e-5)


def test_cuda_amp_names_for_flagos_warn_and_work():
    x = torch.randn(4, 4, device="flagos")
    with pytest.warns(FutureWarning, match=r"torch.amp.autocast\('flagos'"):
        ctx = torch.flagos.amp.autocast(dtype=torch.bfloat16)
    with ctx:
        assert torch.mm(x, x).dtype == torch.bfloat16
    with pytest.warns(FutureWarning, match=r"torch.amp.GradScaler\('flagos'"):
        scaler = torch.flagos.amp.GradScaler(init_scale=8.0)
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 8.0
    assert scaler.scale(torch.ones(2, device="flagos")).device.type == "flagos"


def test_autocast_matmul_and_linear_run_in_bfloat16():
    a = torch.randn(8, 16, device="flagos")
    b = torch.randn(16, 4, device="flagos")
    lin = nn.Linear(16, 4).to("flagos")
    with torch.autocast("flagos", dtype=torch.bfloat16):
        assert torch.is_autocast_enabled("flagos")
        mm = a @ b
        out = lin(a)
        bmm = torch.bmm(a.unsqueeze(0), b.unsqueeze(0))
    assert mm.dtype == torch.bfloat16
    assert out.dtype == torch.bfloat16
    assert bmm.dtype == torch.bfloat16
    assert mm.device.type == "flagos"
    # cuBLAS may reduce bf16 products in bf16 (allow_bf16_reduced_precision_reduction):
    # partial sums near 4 carry an ulp of 0.03, so the bound is Linear's below.
    ref = a.cpu().bfloat16() @ b.cpu().bfloat16()
    close(mm.float(), ref.float(), rtol=1.6e-2, atol=3e-2)
    close(out.float(), lin.cpu()(a.cpu()), rtol=3e-2, atol=3e-2)
    # outside the region, fp32 again
    assert (a @ b).dtype == torch.float32


def test_autocast_fp32_policy_ops_stay_float32():
    x = torch.randn(4, 8, device="flagos").bfloat16()
    w = torch.randn(8, device="flagos")
    with torch.autocast("flagos", dtype=torch.bfloat16):
        ln = F.layer_norm(x, (8,), w)
        ex = torch.exp(x)
        lg = torch.log(x.abs() + 1)
        mse = F.mse_loss(x, x * 0.5)
        sm = torch.softmax(torch.randn(4, 8, device="flagos"), dim=-1)
    for t in (ln, ex, lg, mse, sm):
        assert t.dtype == torch.float32
    close(ex, torch.exp(x.cpu().float()), rtol=1e-5, atol=1e-5)


def test_autocast_float16():
    a = torch.randn(4, 4, device="flagos")
    with torch.autocast("flagos", dtype=torch.float16):
        y = a @ a
    assert y.dtype == torch.float16


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_refuses_binary_cross_entropy_as_cuda_does(dtype):
    # CUDA's autocast bans it (fp16 saturates next to a sigmoid's 0 and 1),
    # outside PyTorch's op lists; the logits form stays allowed, in fp32.
    p = torch.rand(6, 5, device="flagos") * 0.98 + 0.01
    target = torch.rand(6, 5, device="flagos")
    logits = torch.randn(6, 5, device="flagos")
    with torch.autocast("flagos", dtype=dtype):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are "
                                               "unsafe to autocast"):
            F.binary_cross_entropy(p, target)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            nn.BCELoss()(p, target)
        safe = F.binary_cross_entropy_with_logits(logits.to(dtype), target)
    assert safe.dtype == torch.float32
    ref = F.binary_cross_entropy_with_logits(logits.cpu().to(dtype).double(), target.cpu().double())
    close(safe.double(), ref, rtol=1e-5, atol=1e-6)
    # Outside the region, the op runs as usual.
    close(F.binary_cross_entropy(p, target).double(),
          F.binary_cross_entropy(p.cpu().double(), target.cpu().double()), rtol=1e-5, atol=1e-6)


def test_autocast_backward_gives_float32_grads():
    model = make_mlp().to("flagos")
    x = torch.randn(8, 16, device="flagos")
    with torch.autocast("flagos", dtype=torch.bfloat16):
        out = model(x)
        loss = out.float().pow(2).mean()
    assert out.dtype == torch.bfloat16
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == torch.float32
        assert torch.isfinite(p.grad.cpu()).all()


def test_autocast_does_not_affect_cpu_tensors():
    a = torch.randn(4, 4)
    with torch.autocast("flagos", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float32


# ---------------------------------------------------------------- GradScaler


def test_grad_scaler_step_updates_mlp():
    model = make_mlp().to("flagos")
    before = [p.detach().cpu().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("flagos", init_scale=1024.0)
    x, target = torch.randn(8, 16, device="flagos"), torch.randn(8, 4, device="flagos")
    for _ in range(3):
        opt.zero_grad()
        with torch.autocast("flagos", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), target)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == 1024.0  # no inf/nan: scale kept
    for b, p in zip(before, model.parameters()):
        assert p.device.type == "flagos"
        assert not torch.equal(p.detach().cpu(), b)


def test_grad_scaler_unscaled_gradients_match_plain_backward():
    model = make_mlp().to("flagos")
    ref = copy.deepcopy(model)
    x, target = torch.randn(8, 16, device="flagos"), torch.randn(8, 4, device="flagos")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("flagos", init_scale=256.0)
    scaler.scale(F.mse_loss(model(x), target)).backward()
    scaler.unscale_(opt)
    F.mse_loss(ref(x), target).backward()
    for p, r in zip(model.parameters(), ref.parameters()):
        close(p.grad, r.grad, rtol=1e-5, atol=1e-6)


def test_grad_scaler_skips_step_and_backs_off_on_inf():
    model = nn.Linear(4, 2).to("flagos")
    before = [p.detach().cpu().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("flagos", init_scale=128.0)
    loss = model(torch.randn(3, 4, device="flagos")).sum()
    scaler.scale(loss).backward()
    model.weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 64.0
    for b, p in zip(before, model.parameters()):
        assert torch.equal(p.detach().cpu(), b)


THREADS_CHILD = r"""
import json, threading
import torch, torch_fl

def backward_threads(device, grad=False):
    seen = []
    x = torch.randn(8, device=device, requires_grad=True)
    x.register_hook(lambda g: seen.append(torch.get_num_threads()))
    loss = x.sin().sum()
    torch.autograd.grad(loss, x) if grad else loss.backward()
    return seen[0]

def bias_grad(device):
    # A sum over 2**20 rows: its rounding depends on the number of threads.
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 1).to(device)
    x = torch.randn(1 << 20, 8).to(device)
    layer(x).square().mean().backward()
    return layer.bias.grad.cpu().item()

out = {"main": torch.get_num_threads()}
# A DataLoader's pin-memory thread sets one thread for itself.
t = threading.Thread(target=torch.set_num_threads, args=(1,)); t.start(); t.join()
out["after_other_thread"] = [torch.get_num_threads(), backward_threads("cpu"),
                             backward_threads("flagos")]
out["bias_grad"] = [bias_grad("cpu"), bias_grad("flagos")]
torch.set_num_threads(1)
out["after_main_sets_1"] = [backward_threads("cpu", grad=True), backward_threads("flagos", grad=True)]
print(json.dumps(out))
"""


@pytest.mark.host_only  # the cuda driver's worker thread launches kernels only
def test_flagos_backward_runs_with_the_callers_thread_count(run_py):
    # The autograd engine's flagos worker thread kept the thread count last set
    # by any thread when it started (a pin-memory thread's 1), so flagos'
    # backward ran single-threaded where the CPU's did not, and sums differed.
    rc, out, err = run_py(THREADS_CHILD)
    assert rc == 0, err[-3000:]
    got = json.loads(out.strip().splitlines()[-1])
    main = got["main"]
    assert got["after_other_thread"] == [main, main, main], got
    assert got["bias_grad"][0] == got["bias_grad"][1], got
    assert got["after_main_sets_1"] == [1, 1], got
