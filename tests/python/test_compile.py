"""torch.compile on flagos (docs/compile.md).

Every test but the ``backend="flagos"`` ones compiles with plain
``torch.compile`` (Inductor) and compares against eager flagos, with explicit
tolerances:
Inductor fuses and reorders float arithmetic, so compiled and eager results
differ in the last bits. On the host driver the generated C++ kernels are the
CPU's, so compiled flagos equals compiled CPU bit for bit; on the cuda driver
the Triton kernels are CUDA's, so compiled flagos with all-cuda routing equals
compiled CUDA bit for bit. Compiling is slow on two cores: compiled callables
are shared between tests (module-scoped fixtures) and inputs are small.
"""

import importlib.metadata
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._inductor.utils import run_and_get_code

import torch_fl

ON_CUDA = torch_fl.driver() == "cuda"
# The device whose compile behaviour flagos must match: its native one.
NATIVE = "cuda" if ON_CUDA else "cpu"
TOL = dict(rtol=1e-5, atol=1e-5)

_AUTOLOAD_INSTALLED = any(
    ep.value.startswith("torch_fl_autoload")
    for ep in importlib.metadata.entry_points(group="torch.backends"))


def randn(*shape, seed, device="flagos", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(device)


def kernel_code(codes) -> str:
    return "\n".join(codes)


# --- registration -------------------------------------------------------------

_LAZY_CHILD = """
import sys
import torch
{import_torch_fl}
assert "torch_fl" in sys.modules
heavy = [m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules]
assert not heavy, f"imported at import time: {{heavy}}"
x = torch.randn(4, 8, device="flagos")
y = torch.compile(lambda t: (t * 2).sin().sum(-1))(x)
torch.testing.assert_close(y.cpu(), (x.cpu() * 2).sin().sum(-1), rtol=1e-5, atol=1e-5)
from torch._inductor.codegen.common import get_scheduling_for_device
from torch._dynamo.device_interface import get_interface_for_device
from torch._dynamo import list_backends
assert "flagos" in list_backends(), list_backends()
print(get_scheduling_for_device("flagos").__name__, get_interface_for_device("flagos").__name__)
"""

# Dynamo imported before torch_fl (autoload off): the backend name is
# registered at once, since the registry's import is past.
_DYNAMO_FIRST_CHILD = """
import torch
import torch._dynamo
import torch_fl
assert "flagos" in torch._dynamo.list_backends(), torch._dynamo.list_backends()
print("registered")
"""


@pytest.fixture(scope="module")
def lazy_child(start_py):
    # Started first, so the child's compile overlaps the tests of this process.
    code = _LAZY_CHILD.format(import_torch_fl="" if _AUTOLOAD_INSTALLED else "import torch_fl")
    return start_py(code, timeout=240)


def test_plain_compile_works_after_import_and_registers_lazily(lazy_child):
    rc, out, err = lazy_child.result()
    assert rc == 0, err[-3000:]
    scheduling = "FlagosTritonScheduling" if ON_CUDA else "FlagosCppScheduling"
    assert out.split() == [scheduling, "FlagosInterface"], out


def test_importing_the_device_interface_module_first_registers_it(run_py):
    # The module imports Dynamo on its first line, which runs the hook while
    # the module is still executing.
    code = ("import warnings\n"
            "warnings.simplefilter('error', RuntimeWarning)\n"
            "import torch_fl.compile.device_interface\n"
            "from torch._dynamo.device_interface import get_interface_for_device\n"
            "print(get_interface_for_device('flagos').__name__)\n")
    rc, out, err = run_py(code)
    assert rc == 0, err[-3000:]
    assert out.split() == ["FlagosInterface"], out


def test_backend_name_registered_when_dynamo_was_imported_first(run_py):
    rc, out, err = run_py(_DYNAMO_FIRST_CHILD, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert rc == 0, err[-3000:]
    assert out.split() == ["registered"], out


# --- shared workloads -----------------------------------------------------------


class NormMLP(nn.Module):
    """RMSNorm (a reduction fused with pointwise ops), a gated MLP (matmuls) and a residual."""

    def __init__(self, dim=32, hidden=64):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.up = nn.Linear(dim, 2 * hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        gate, up = self.up(h).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


def make_module(device, seed=0):
    torch.manual_seed(seed)
    return NormMLP().to(device)


@pytest.fixture(scope="module")
def compiled_module():
    module = make_module("flagos")
    return module, torch.compile(module)


@pytest.fixture(scope="module")
def module_run(compiled_module):
    """The first call of the compiled module, with the code Inductor generated."""
    module, compiled = compiled_module
    x = randn(4, 8, 32, seed=1)
    with torch.no_grad():
        out, codes = run_and_get_code(compiled, x)
    return x, out, kernel_code(codes)


def test_compiled_module_matches_eager(compiled_module, module_run):
    module, compiled = compiled_module
    x, out, _ = module_run
    with torch.no_grad():
        ref = module(x)
        assert out.device == x.device
        torch.testing.assert_close(out.cpu(), ref.cpu(), **TOL)
        x2 = randn(4, 8, 32, seed=2)  # same shapes, fresh values: no recompile needed
        torch.testing.assert_close(compiled(x2).cpu(), module(x2).cpu(), **TOL)


def test_flagos_backend_is_inductor_bit_for_bit(compiled_module, module_run):
    module, _ = compiled_module
    x, out, code = module_run
    with torch.no_grad():
        named, named_codes = run_and_get_code(torch.compile(module, backend="flagos"), x)
    assert torch.equal(named.cpu(), out.cpu())
    assert kernel_code(named_codes) == code


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="fastest"), "Unrecognized mode=fastest, should be one of: default"),
    (dict(options={"no_such_option": 1}), "Unexpected optimization option no_such_option"),
    (dict(options={"max_autotune": "yes"}), "Unexpected type of attr max_autotune"),
])
def test_flagos_backend_passes_mode_and_options_to_inductor(kwargs, message):
    fn = torch.compile(lambda t: t * 3 - 1, backend="flagos", **kwargs)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=message):
        fn(randn(5, seed=3))


def test_reduction_fuses_with_pointwise_and_matmuls_stay_extern(module_run):
    _, _, code = module_run
    # One kernel computes the mean of squares and applies it (rsqrt, mul):
    # descriptive kernel names list the fused aten ops.
    fused = re.findall(r"(?:cpp|triton_\w+?)_fused_(\w+)", code)
    assert any("mean" in k and "mul" in k for k in fused), fused
    lang = "@triton.jit" if ON_CUDA else "extern \"C\""
    assert lang in code
    # Matmuls are ATen calls (extern kernels), which flagos routing serves.
    assert "extern_kernels.addmm" in code or "extern_kernels.mm" in code


@pytest.mark.host_only
def test_compiled_flagos_equals_compiled_cpu_bit_for_bit(compiled_module, module_run):
    x, out, _ = module_run
    module_cpu = make_module("cpu")
    with torch.no_grad():
        ref = torch.compile(module_cpu)(x.cpu())
    assert torch.equal(out.cpu(), ref)


def test_extern_kernels_go_through_flagos_routing():
    backend = "cuda" if ON_CUDA else "cpu"
    fn = torch.compile(lambda a, b: (a @ b).relu() + 1)
    a, b = randn(8, 16, seed=3), randn(16, 4, seed=4)
    fn(a, b)  # compile first: routing counts only the calls below
    torch_fl.routing.set_route("mm", backend)
    try:
        torch_fl.routing.reset_stats()
        out = fn(a, b)
        calls = {s.op: s.calls for s in torch_fl.routing.stats()}
    finally:
        torch_fl.routing.set_route("mm", "")
    torch.testing.assert_close(out.cpu(), (a.cpu() @ b.cpu()).relu() + 1, **TOL)
    mm = {op: c for op, c in calls.items() if op.startswith("aten::mm")}
    assert mm and all(c.get(backend, 0) >= 1 for c in mm.values()), calls


def test_second_device_keeps_its_tensors_there():
    x = randn(8, 8, seed=8, device="flagos:1")
    fn = torch.compile(lambda t: (t @ t).softmax(-1).sum(0) + t[0])
    out = fn(x)
    assert out.device == x.device
    torch.testing.assert_close(out.cpu(), (x.cpu() @ x.cpu()).softmax(-1).sum(0) + x.cpu()[0], **TOL)


def test_subgraph_buffers_stay_on_the_second_device():
    from torch._higher_order_ops.while_loop import while_loop

    @torch.compiler.nested_compile_region
    def block(t):
        return (t @ t).relu() + 1

    cases = {
        "cond": lambda t: torch.cond(t.sum() > 0, lambda t: (t.sin() @ t).exp(),
                                     lambda t: (t.cos() @ t) * 2, (t,)),
        "while_loop": lambda t: while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, (t @ t).tanh()),
                                           (torch.tensor(0, device=t.device), t))[1],
        "nested_compile_region": lambda t: block(block(t)) * 2,
    }
    x = randn(4, 4, seed=11)
    for name, fn in cases.items():
        torch._dynamo.reset()
        out = torch.compile(fn)(x.to("flagos:1"))
        assert out.device == torch.device("flagos:1"), name
        torch.testing.assert_close(out.cpu(), fn(x.cpu()), **TOL, msg=name)


def test_device_module_calls_trace_under_fullgraph():
    def fn(t):
        torch.flagos.synchronize()
        torch.flagos.synchronize(t.device)
        return t * 2 + torch.flagos.current_device()

    last = torch.flagos.device_count() - 1
    torch._dynamo.reset()
    for index in sorted({0, last}):
        with torch.flagos.device(index):
            x = randn(3, seed=17, device=f"flagos:{index}")
            out, code = run_and_get_code(torch.compile(fn, fullgraph=True), x)
            assert torch.equal(out, fn(x)) and torch.equal(out.cpu(), x.cpu() * 2 + index)
            # A bare synchronize() waits on the current device, not on device 0 (where this
            # torch compiles it into an op; torch 2.11 does not).
            calls = re.findall(r"synchronize_device\.default\('flagos', (\d+)\)", code[0])
            assert all(int(i) == index for i in calls), calls
            if hasattr(torch.ops.streams, "synchronize_device"):
                assert len(calls) == 2, code[0]


def test_device_queries_fold_under_fullgraph():
    def fn(t):
        if torch.flagos.is_available():
            return t * torch.flagos.device_count()
        return t

    torch._dynamo.reset()
    x = randn(5, seed=23)
    counter = CompileCounterWithBackend("inductor")
    out = torch.compile(fn, fullgraph=True, backend=counter)(x)
    assert torch.equal(out.cpu(), fn(x).cpu())
    assert counter.frame_count == 1


def test_a_device_query_that_raises_is_caught_in_compiled_code():
    # Not folded: an error of a folded call would fail the compile, where eager code catches it.
    def fn(t, i):
        try:
            major = torch.flagos.get_device_capability()[0]
        except RuntimeError:  # the host driver has no capability
            major = -1
        return t * major + len(torch.flagos.get_device_name(i))

    torch._dynamo.reset()
    x = randn(4, seed=27)
    compiled = torch.compile(fn)
    for i in range(torch.flagos.device_count()):  # an index that may turn dynamic
        assert torch.equal(compiled(x, i).cpu(), fn(x, i).cpu())


def _has_device_context_registry() -> bool:
    from torch._dynamo.variables import ctx_manager

    return hasattr(ctx_manager, "register_device_context_manager")


@pytest.mark.skipif(not _has_device_context_registry(),
                    reason="this torch's Dynamo has no registry of device context managers")
def test_device_context_switches_the_device_under_fullgraph():
    def fn(t):
        with torch.flagos.device(1):
            made = torch.ones(2, device="flagos")
            inside = torch.flagos.current_device()
        return made, t * 2 + inside

    def two_contexts(t):
        with torch.flagos.device(1):
            a = torch.zeros(3, device="flagos")
            with torch.flagos.device(0):
                b = torch.zeros(3, device="flagos")
        c = torch.zeros(3, device="flagos")
        return a, b, c, t + 1

    torch._dynamo.reset()
    with torch.flagos.device(0):
        x = randn(3, seed=24)
        made, out = torch.compile(fn, fullgraph=True)(x)
        assert made.device == torch.device("flagos:1") and torch.flagos.current_device() == 0
        assert torch.equal(out.cpu(), x.cpu() * 2 + 1)
        # FakeTensor's cache keys leave the device out: each switch must clear it.
        devices = [r.device.index for r in torch.compile(two_contexts, fullgraph=True)(x)]
        assert devices == [1, 0, 0, 0] and torch.flagos.current_device() == 0


def _side_stream(t):
    s = torch.flagos.Stream()
    s.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(s):
        y = t * 2 + 1
    torch.flagos.current_stream().wait_stream(s)
    return y


def test_a_side_stream_in_a_compiled_function_gives_eager_results_and_is_left():
    # The host driver breaks the graph at the stream calls (compile/dynamo_rules.py);
    # the code they leave to run eagerly once left the side stream current.
    torch._dynamo.reset()
    x = randn(1000, seed=25)
    before = torch.flagos.current_stream()
    for fn in (_side_stream, lambda t: _side_stream(t) * 3):
        assert torch.equal(torch.compile(fn)(x).cpu(), fn(x).cpu())
        assert torch.flagos.current_stream() == before


@pytest.mark.skipif(torch.flagos.device_count() < 2, reason="needs two flagos devices")
def test_a_stream_of_another_device_is_left_as_it_was():
    def fn(t, s):
        with torch.flagos.stream(s):
            y = t * 2
        return y

    torch._dynamo.reset()
    with torch.flagos.device(0):
        x = randn(8, seed=28)
        side = torch.flagos.Stream(1)
        before = [torch.flagos.current_stream(i) for i in (0, 1)]
        assert torch.equal(torch.compile(fn)(x, side).cpu(), x.cpu() * 2)
        assert [torch.flagos.current_stream(i) for i in (0, 1)] == before
        assert torch.flagos.current_device() == 0


@pytest.mark.cuda
def test_streams_trace_under_fullgraph_on_the_cuda_driver():
    torch._dynamo.reset()
    x = randn(1000, seed=26)
    counter = CompileCounterWithBackend("inductor")
    before = torch.flagos.current_stream()
    out = torch.compile(_side_stream, fullgraph=True, backend=counter)(x)
    torch.flagos.synchronize()
    assert torch.equal(out.cpu(), _side_stream(x).cpu()) and counter.frame_count == 1
    assert torch.flagos.current_stream() == before


@pytest.mark.parametrize("shape", [(8, 6), (3, 5, 4)], ids=["2d", "3d"])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argreduce_of_a_permuted_input_returns_the_logical_index(op, shape):
    x = randn(*shape, seed=12)
    fn = torch.compile(lambda t: getattr(t.permute(*reversed(range(t.dim()))), op)())
    expected = getattr(x.cpu().permute(*reversed(range(x.dim()))), op)()
    assert fn(x).item() == expected.item()


@pytest.mark.host_only  # CUDA's scatter kernels, eager and Triton, add atomically
@pytest.mark.parametrize("op", ["scatter_add", "scatter_reduce"])
def test_compiled_scatter_sum_is_deterministic_and_equals_eager(op):
    # Two threads at least: with one, the generated loop is serial and the fallback moot.
    from torch._inductor import config

    src = randn(4000, seed=13)
    index = torch.randint(0, 7, (4000,), generator=torch.Generator().manual_seed(14)).to("flagos")

    def fn(s, i):
        base = torch.zeros(7, device=s.device)
        if op == "scatter_add":
            return base.scatter_add(0, i, s * 3)
        return base.scatter_reduce(0, i, s * 3, "sum")

    torch._dynamo.reset()
    with config.patch({"cpp.threads": 2}):
        compiled = torch.compile(fn)
        outs = [compiled(src, index) for _ in range(4)]
    eager = fn(src, index)
    assert all(torch.equal(o, eager) for o in outs)


@pytest.mark.host_only
@pytest.mark.parametrize("case", ["var", "std_far_from_zero", "layer_norm", "batch_norm_train",
                                  "masked_softmax", "reused_tanh_bf16", "divide_by_constant",
                                  "hardswish", "int_true_divide", "avg_pool",
                                  "conv1d_bias", "conv2d_bias_bf16", "conv_transpose2d_bias_bf16"])
def test_device_name_decisions_match_compiled_cpu_bit_for_bit(case):
    # Inductor picks var_mean's algorithm and what to recompute by the device's name:
    # flagos must get the CPU's choice, and so the CPU's bits.
    x = randn(64, 32, seed=18, device="cpu")
    fns = {
        "var": lambda t: t.var(0),
        "std_far_from_zero": lambda t: (t + 1e4).std(0),
        "layer_norm": lambda t: F.layer_norm(t, (32,)),
        "batch_norm_train": lambda t: F.batch_norm(t, None, None, training=True),
        "masked_softmax": lambda t: t.masked_fill(t < 0, float("-inf")).softmax(-1),
        "reused_tanh_bf16": lambda t: (lambda y: (y * y).sum(0) + y.mean(0))(
            t.to(torch.bfloat16).tanh() + t.to(torch.bfloat16)),
        # The CPU divides by a constant; other devices multiply by its reciprocal.
        "divide_by_constant": lambda t: t / 3.0,
        "hardswish": F.hardswish,
        "int_true_divide": lambda t: (t * 100).int() / 7,
        "avg_pool": lambda t: F.adaptive_avg_pool2d(F.avg_pool2d(t[None, None], 3), (5, 4)),
        # Other devices add a convolution's bias in a kernel of its own: one more rounding.
        "conv1d_bias": lambda t: F.conv1d(t[None], t.reshape(-1)[:960].reshape(5, 64, 3), t[0, :5]),
        "conv2d_bias_bf16": lambda t: F.conv2d(
            t.to(torch.bfloat16).view(1, 2, 32, 32), t[:6, :18].to(torch.bfloat16).reshape(6, 2, 3, 3),
            t[1, :6].to(torch.bfloat16)),
        "conv_transpose2d_bias_bf16": lambda t: F.conv_transpose2d(
            t.to(torch.bfloat16).view(1, 2, 32, 32), t[:2, :27].to(torch.bfloat16).reshape(2, 3, 3, 3),
            t[2, :3].to(torch.bfloat16)),
    }
    fn = fns[case]
    torch._dynamo.reset()
    expected = torch.compile(fn)(x)
    torch._dynamo.reset()
    out = torch.compile(fn)(x.to("flagos"))
    assert torch.equal(out.cpu(), expected)
    if case == "std_far_from_zero":  # the two-pass variance keeps the digits Welford's loses here
        exact = (x + 1e4).double().std(0)
        assert ((out.cpu().double() - exact).abs() / exact).max() < 1e-5


def test_combo_kernels_option_compiles():
    from torch._inductor import config

    x, y = randn(16, 8, seed=15), randn(16, 8, seed=16)
    fn = lambda a, b: (a.sin() + 1, b.cos() * 2, (a * b).sum(0))  # noqa: E731
    torch._dynamo.reset()
    with config.patch(combo_kernels=True):
        outs = torch.compile(fn)(x, y)
    for out, ref in zip(outs, fn(x.cpu(), y.cpu())):
        torch.testing.assert_close(out.cpu(), ref, **TOL)


# --- training ------------------------------------------------------------------


def test_training_step_matches_eager():
    steps = 3
    eager, compiled_model = make_module("flagos", seed=5), make_module("flagos", seed=5)
    step_fn = torch.compile(compiled_model)
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_c = torch.optim.AdamW(compiled_model.parameters(), lr=1e-2)
    for i in range(steps):
        x, target = randn(4, 8, 32, seed=10 + i), randn(4, 8, 32, seed=20 + i)
        losses = []
        for model, fwd, opt in ((eager, eager, opt_e), (compiled_model, step_fn, opt_c)):
            loss = F.mse_loss(fwd(x), target)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6), (i, losses)
    for (name, p_e), p_c in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(p_c.cpu(), p_e.cpu(), rtol=1e-5, atol=1e-5, msg=name)


def test_autocast_inside_compile():
    fn = torch.compile(_autocast_mm)
    a, b = randn(16, 16, seed=6), randn(16, 16, seed=7)
    out = fn(a, b)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().cpu(), _autocast_mm(a, b).float().cpu(), rtol=1e-2, atol=1e-2)


def _autocast_mm(a, b):
    with torch.autocast("flagos", dtype=torch.bfloat16):
        return (a @ b).relu()


# --- a Hugging Face model -------------------------------------------------------


def test_hf_qwen3_logits_match_eager():
    qwen3_workload = _qwen3_workload()
    model = qwen3_workload.build_model("tiny", device="flagos")
    ids = qwen3_workload.prompt_ids(model.config.vocab_size, 2, 16, seed=0).to("flagos")
    compiled = torch.compile(model, fullgraph=False)
    with torch.no_grad():
        ref = model(input_ids=ids).logits
        out = compiled(input_ids=ids).logits
    assert out.device == ids.device
    torch.testing.assert_close(out.cpu(), ref.cpu(), rtol=1e-4, atol=1e-4)
    assert torch.equal(out.argmax(-1).cpu(), ref.argmax(-1).cpu())


def _qwen3_workload():
    import os
    import sys

    pytest.importorskip("transformers")
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
    sys.path.insert(0, os.path.normpath(examples))
    import qwen3_workload

    return qwen3_workload


# --- recompilation ---------------------------------------------------------------


def _shape_fn(x):
    return (x.sin() * 2).sum(-1) + x.shape[0]


def _frame_counts(device, sizes, **kwargs):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    fn = torch.compile(_shape_fn, backend=counter, **kwargs)
    counts = []
    for i, n in enumerate(sizes):
        x = randn(n, 8, seed=30 + i, device=device)
        torch.testing.assert_close(fn(x).cpu(), _shape_fn(x.cpu()), **TOL)
        counts.append(counter.frame_count)
    return counts


def test_recompiles_where_the_native_device_does():
    sizes = [4, 4, 5, 6, 7]
    got = _frame_counts("flagos", sizes)
    # Same shape: no recompile; a new shape: one (automatic dynamic), then none.
    assert got == [1, 1, 2, 2, 2]
    assert got == _frame_counts(NATIVE, sizes)
    dynamic = _frame_counts("flagos", sizes[1:4], dynamic=True)
    assert dynamic == [1, 1, 1]
    assert dynamic == _frame_counts(NATIVE, sizes[1:4], dynamic=True)


# --- modes ---------------------------------------------------------------------


def _mode_fn(a, w):
    return torch.softmax(a @ w, dim=-1) * 2 + a.mean()


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs", "reduce-overhead"])
def test_modes_match_eager_and_keep_earlier_results(mode):
    fn = torch.compile(_mode_fn, mode=mode)
    w = randn(16, 16, seed=40)
    outs, refs = [], []
    for i in range(4):  # warm-up, capture (cuda driver), then replays
        a = randn(8, 16, seed=41 + i)
        outs.append(fn(a, w))
        refs.append(_mode_fn(a, w))
    for i, (out, ref) in enumerate(zip(outs, refs)):
        # Earlier results stay valid after later calls (no reuse of graph memory).
        torch.testing.assert_close(out.cpu(), ref.cpu(), **TOL, msg=f"call {i}")


# --- convolutions: FakeTensors follow the native kernel's layout ------------------------


@pytest.mark.parametrize("mkldnn", [True, False], ids=["onednn", "no_onednn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_fake_convolution_layout_is_the_native_kernels(dtype, mkldnn):
    # Each native backend's rule (oneDNN, slow2d on the CPU; cuDNN on CUDA),
    # for the forward and the backward's gradients.
    from torch._subclasses.fake_tensor import FakeTensorMode

    conv = nn.Conv2d(3, 8, 3).to("flagos", dtype)
    args = ([1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    with torch.backends.mkldnn.flags(enabled=mkldnn):
        for fmt in (torch.contiguous_format, torch.channels_last):
            x = randn(2, 3, 8, 8, seed=70, dtype=dtype).to(memory_format=fmt)
            real = torch.ops.aten.convolution(x, conv.weight, conv.bias, *args)
            grads = torch.ops.aten.convolution_backward(
                real, x, conv.weight, [8], *args, [True, True, False])
            with FakeTensorMode() as mode:
                fx, fw, fb, fy = (mode.from_tensor(t) for t in (x, conv.weight, conv.bias, real))
                fake = torch.ops.aten.convolution(fx, fw, fb, *args)
                fake_grads = torch.ops.aten.convolution_backward(
                    fy, fx, fw, [8], *args, [True, True, False])
            assert fake.stride() == real.stride(), fmt
            for g, f in zip(grads[:2], fake_grads[:2]):
                assert f.stride() == g.stride(), fmt


def test_compiled_channels_last_conv_keeps_its_layout():
    conv = nn.Conv2d(3, 8, 3).to("flagos")
    x = randn(2, 3, 8, 8, seed=71).to(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = conv(x).relu()
        out = torch.compile(lambda t: conv(t).relu())(x)
    assert out.stride() == ref.stride()
    torch.testing.assert_close(out.cpu(), ref.cpu(), **TOL)


def test_freezing_with_channels_last_weights_runs(monkeypatch):
    # Freezing's layout optimisation makes the weights channels_last; the
    # compiled graph must expect the layout the convolution then returns.
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(inductor_config, "freezing", True)
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).to("flagos").eval()
    x = randn(2, 3, 8, 8, seed=72)
    with torch.no_grad():
        ref = model(x)
        out = torch.compile(model)(x)
    torch.testing.assert_close(out.cpu(), ref.cpu(), **TOL)


# --- FakeTensor metadata ----------------------------------------------------------


def test_fake_tensors_keep_the_flagos_device():
    seen = []

    def record(gm, example_inputs):
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                val = node.meta.get("example_value")
                if isinstance(val, torch.Tensor):
                    seen.append((type(val).__name__, val.device))
            elif node.op == "call_function":
                val = node.meta.get("example_value")
                if isinstance(val, torch.Tensor):
                    seen.append(("out", val.device))
        return gm.forward

    n = torch.flagos.device_count()
    devices = ["flagos:0"] + (["flagos:1"] if n > 1 else [])
    for d in devices:
        seen.clear()
        torch._dynamo.reset()
        x = torch.randn(3, 4, device=d)
        out = torch.compile(lambda t: t.cos() + 1, backend=record)(x)
        assert out.device == x.device
        assert seen and all(dev == x.device for _, dev in seen), seen
        assert ("FakeTensor", x.device) in seen, seen


# --- cuda driver -------------------------------------------------------------------


@pytest.mark.cuda
def test_cuda_triton_kernels_target_cuda_and_run_on_the_flagos_stream():
    x = randn(64, 128, seed=50)
    fn = torch.compile(lambda t: torch.softmax(t * 3, dim=-1).sum(0))
    out, codes = run_and_get_code(fn, x)
    code = kernel_code(codes)
    assert "@triton.jit" in code
    assert "DeviceProperties(type='cuda'" in code and "type='flagos'" not in code
    torch.testing.assert_close(out.cpu(), torch.softmax(x.cpu() * 3, -1).sum(0), **TOL)
    # Launched on the current flagos stream: a graph captured on a flagos
    # stream records them, and replaying it recomputes from new inputs.
    static_x = x.clone()
    g = torch.flagos.FlagosGraph()
    with torch.flagos.graph(g):
        static_out = fn(static_x)
    x2 = randn(64, 128, seed=53)
    static_x.copy_(x2)
    g.replay()
    torch.testing.assert_close(static_out.cpu(), fn(x2).cpu(), rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_compiled_flagos_equals_compiled_cuda_with_all_cuda_routing():
    module = make_module("flagos")
    module_cuda = make_module("cuda")
    x = randn(4, 8, 32, seed=51)
    torch_fl.routing.set_route("*", "cuda")
    try:
        with torch.no_grad():
            out = torch.compile(module)(x)
            ref = torch.compile(module_cuda)(x.to("cuda"))
    finally:
        torch_fl.routing.set_route("*", "")
    assert torch.equal(out.cpu(), ref.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["inductor", "flagos"])
def test_cuda_reduce_overhead_captures_and_replays_like_default_mode(backend):
    from torch_fl.compile import cudagraphs

    cache = torch.zeros(16, 64, device="flagos")
    torch._dynamo.mark_static_address(cache)
    w = randn(64, 64, seed=52)

    def step(tok, pos):
        h = torch.tanh(tok @ w)
        cache.index_copy_(0, pos, h)
        return torch.softmax(h @ cache.T, dim=-1)

    graphed = torch.compile(step, backend=backend, mode="reduce-overhead")
    plain = torch.compile(step, mode="default")
    before = dict(cudagraphs.counters)
    outs, refs = [], []
    for i in range(5):
        tok, pos = randn(1, 64, seed=60 + i), torch.tensor([i], device="flagos")
        snapshot = cache.clone()
        outs.append(graphed(tok, pos))
        after_graphed = cache.clone()
        cache.copy_(snapshot)
        refs.append(plain(tok, pos))
        assert torch.equal(cache, after_graphed), i  # the in-place update happened in the graph
    for i, (o, r) in enumerate(zip(outs, refs)):
        assert torch.equal(o, r), i
    assert cudagraphs.counters["captures"] - before.get("captures", 0) == 1
    assert cudagraphs.counters["replays"] - before.get("replays", 0) >= 3
