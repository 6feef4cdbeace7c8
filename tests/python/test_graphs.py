"""torch.flagos graphs (torch_fl/flagos/graphs.py, docs/compile.md).

On the cuda driver: a decode-like step (embedding, RMSNorm, attention over a
static KV cache updated in place, gated MLP, logits) captured with
``torch.flagos.graph`` and replayed for several tokens gives exactly the eager
results, with all-cuda routing and with the default routing (FlagGems where it
is installed); ``make_graphed_callables`` trains like eager. On the host
driver every entry point says it needs the cuda driver.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_fl

DIM, HEADS, VOCAB, MAX_LEN = 64, 4, 128, 16


def randn(*shape, seed, device="flagos"):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(device)


@pytest.mark.host_only
@pytest.mark.parametrize("entry", ["FlagosGraph", "graph", "graph_pool_handle", "make_graphed_callables"])
def test_graphs_api_names_the_driver_on_host(entry):
    calls = {
        "FlagosGraph": lambda: torch.flagos.FlagosGraph(),
        "graph": lambda: torch.flagos.graph(None),
        "graph_pool_handle": lambda: torch.flagos.graph_pool_handle(),
        "make_graphed_callables": lambda: torch.flagos.make_graphed_callables(
            torch.nn.Linear(2, 2), (torch.randn(1, 2, device="flagos"),)),
    }
    with pytest.raises(RuntimeError, match=r"needs the cuda driver.*'host' driver"):
        calls[entry]()
    assert torch.flagos.is_current_stream_capturing() is False


# --- cuda driver -------------------------------------------------------------------


class DecodeStep:
    """One token of a single-layer decoder over a static KV cache (batch 1)."""

    def __init__(self, seed=0):
        self.embed = randn(VOCAB, DIM, seed=seed)
        self.norm = randn(DIM, seed=seed + 1).abs() + 0.5
        self.qkv = randn(DIM, 3 * DIM, seed=seed + 2) / DIM ** 0.5
        self.out = randn(DIM, DIM, seed=seed + 3) / DIM ** 0.5
        self.up = randn(DIM, 4 * DIM, seed=seed + 4) / DIM ** 0.5
        self.down = randn(2 * DIM, DIM, seed=seed + 5) / DIM ** 0.5
        self.k_cache = torch.zeros(1, HEADS, MAX_LEN, DIM // HEADS, device="flagos")
        self.v_cache = torch.zeros_like(self.k_cache)

    def __call__(self, token, pos, mask):
        """token [1] int64, pos [1] int64, mask [MAX_LEN] bool (positions <= pos)."""
        x = self.embed[token]  # [1, DIM]
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        q, k, v = (h @ self.qkv).view(1, 3, HEADS, DIM // HEADS).unbind(1)
        self.k_cache.index_copy_(2, pos, k.unsqueeze(2))
        self.v_cache.index_copy_(2, pos, v.unsqueeze(2))
        attn = F.scaled_dot_product_attention(q.unsqueeze(2), self.k_cache, self.v_cache,
                                              attn_mask=mask.view(1, 1, 1, MAX_LEN))
        x = x + attn.reshape(1, DIM) @ self.out
        gate, up = (x @ self.up).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ self.down
        return x @ self.embed.T  # logits [1, VOCAB]


def _inputs(i):
    token = torch.tensor([(7 * i + 3) % VOCAB], device="flagos")
    pos = torch.tensor([i], device="flagos")
    mask = torch.arange(MAX_LEN, device="flagos") <= i
    return token, pos, mask


@pytest.fixture(params=["all_cuda", "default"])
def routing(request):
    if request.param == "all_cuda":
        torch_fl.routing.set_route("*", "cuda")
    yield request.param
    torch_fl.routing.set_route("*", "")


@pytest.mark.cuda
def test_captured_decode_step_replays_eager_results_bit_for_bit(routing):
    steps = 8
    eager = DecodeStep()
    ref = [eager(*_inputs(i)) for i in range(steps)]
    ref_cache = eager.k_cache.clone()

    graphed = DecodeStep()
    static = [t.clone() for t in _inputs(0)]
    side = torch.flagos.Stream()
    side.wait_stream(torch.flagos.current_stream())
    with torch.flagos.stream(side):  # warm-up: lazy init, FlagGems' Triton compiles
        graphed(*static)
    torch.flagos.current_stream().wait_stream(side)
    graphed.k_cache.zero_()
    graphed.v_cache.zero_()

    torch_fl.routing.reset_stats()
    g = torch.flagos.FlagosGraph()
    allocated = torch.flagos.memory_allocated()
    with torch.flagos.graph(g):
        static_logits = graphed(*static)
    assert torch.flagos.memory_allocated() > allocated  # the graph's pool is flagos memory
    captured = {s.op: s.calls for s in torch_fl.routing.stats()}
    graphed.k_cache.zero_()  # capture does not run the kernels; start from the same state
    graphed.v_cache.zero_()

    for i in range(steps):
        for dst, src in zip(static, _inputs(i)):
            dst.copy_(src)
        g.replay()
        assert torch.equal(static_logits, ref[i]), f"{routing} step {i}: max |diff| " \
            f"{(static_logits - ref[i]).abs().max().item()}"
    assert torch.equal(graphed.k_cache, ref_cache)

    backends = {b for calls in captured.values() for b in calls}
    if routing == "all_cuda":
        assert backends == {"cuda"}, captured
    elif torch_fl.is_flaggems_enabled():
        # FlagGems' kernels are in the graph (launched from C++ or by its wrappers).
        assert backends & set(torch_fl.routing.FLAGGEMS_KEYS), captured


@pytest.mark.cuda
def test_graph_pool_is_shared_and_reset_frees_it():
    pool = torch.flagos.graph_pool_handle()
    x = randn(256, 256, seed=1)
    graphs, outs = [], []
    for k in range(2):
        g = torch.flagos.FlagosGraph()
        with torch.flagos.graph(g, pool=pool):
            outs.append((x * (k + 2)).relu())
        graphs.append(g)
    assert graphs[0].pool() == graphs[1].pool()
    x.copy_(randn(256, 256, seed=2))
    for g in graphs:
        g.replay()
    torch.testing.assert_close(outs[1], (x * 3).relu(), rtol=0, atol=0)
    for g in graphs:
        g.reset()


@pytest.mark.cuda
def test_graph_rejects_a_stream_of_another_device_type():
    with pytest.raises(TypeError, match="flagos stream"):
        torch.flagos.graph(torch.flagos.FlagosGraph(), stream=torch.cuda.Stream())


@pytest.mark.cuda
def test_make_graphed_callables_trains_like_eager():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8))
    eager = eager.to("flagos")
    graphed = torch.nn.Sequential(*[torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)])
    graphed.load_state_dict(eager.state_dict())
    graphed = graphed.to("flagos")
    sample = randn(16, 32, seed=3).requires_grad_(True)
    graphed = torch.flagos.make_graphed_callables(graphed, (sample,))
    # As with torch.cuda.make_graphed_callables, gradients come out of the
    # graph's static buffers: the usual step zeroes them (set_to_none) before
    # each backward, and each step's gradients are compared.
    for i in range(3):
        for m in (eager, graphed):
            for p in m.parameters():
                p.grad = None
        x = randn(16, 32, seed=10 + i).requires_grad_(True)
        x2 = x.detach().clone().requires_grad_(True)
        out_e, out_g = eager(x), graphed(x2)
        out_e.square().sum().backward()
        out_g.square().sum().backward()
        torch.testing.assert_close(out_g, out_e, rtol=1e-6, atol=1e-6, msg=f"step {i}")
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-6, atol=1e-6, msg=f"step {i}")
        for p_e, p_g in zip(eager.parameters(), graphed.parameters()):
            torch.testing.assert_close(p_g.grad, p_e.grad, rtol=1e-6, atol=1e-6, msg=f"step {i}")


# --- reduce-overhead's bookkeeping, on any driver -------------------------------------


class _StandInGraph:
    """Stands in for a CUDA graph: replay runs the captured call again and writes its
    results into the captured outputs, which is what a replay does to static outputs."""

    capturing = None

    def __init__(self):
        self.call = self.inputs = self.outputs = None

    def replay(self):
        new = self.call(list(self.inputs))
        for old, fresh in zip(self.outputs, new):
            if isinstance(old, torch.Tensor):
                old.copy_(fresh)


class _StandInGraphs:
    FlagosGraph = _StandInGraph

    @staticmethod
    def _require_cuda_driver(what):
        pass

    class graph:
        def __init__(self, g):
            self.g = g

        def __enter__(self):
            _StandInGraph.capturing = self.g

        def __exit__(self, *exc):
            _StandInGraph.capturing = None


def _recorded(call):
    def run(args):
        g = _StandInGraph.capturing
        if g is not None:
            g.call, g.inputs = call, list(args)
        out = call(args)
        if g is not None:
            g.outputs = out
        return out
    return run


def _inductor_like_call(args):
    """Inductor's convention (a list, cleared by the callee): mutates a static input (a
    cache), mutates a non-static one, returns fresh memory, views of it and of both inputs."""
    x, cache, pos, n = args
    args.clear()
    cache[pos] = x.sum() * n
    y = x * 2 + n
    x.add_(1)
    return (y, y[1:], x[:2], cache[:3], n + 1)


def test_graphed_call_keeps_eager_semantics(monkeypatch):
    from torch_fl.compile import cudagraphs

    monkeypatch.setattr(cudagraphs, "graphs", _StandInGraphs)
    # GraphedCall asks CUDA directly whether a capture is under way (never, here)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    cache = torch.zeros(8, device="flagos")
    torch._dynamo.mark_static_address(cache)
    graphed = cudagraphs.GraphedCall(_recorded(_inductor_like_call), mutated_input_idxs=(0, 1))
    eager_cache = cache.clone()
    before = dict(cudagraphs.counters)
    results = []
    for i, n in enumerate([3, 3, 3, 3, 4, 4, 4]):  # warm-up, capture, replays; a new n: again
        x = randn(4, seed=i)
        x_eager = x.clone()
        pos = torch.tensor([i], device="flagos")
        got = graphed([x, cache, pos, n])
        want = _inductor_like_call([x_eager, eager_cache, pos, n])
        results.append((got, want))
        assert torch.equal(x, x_eager), i  # the mutation reached the caller's tensor
        assert torch.equal(cache, eager_cache), i
        assert got[2].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # a view of x
        assert got[3].untyped_storage().data_ptr() == cache.untyped_storage().data_ptr()
        assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    for i, (got, want) in enumerate(results):  # earlier results were not overwritten
        for g, w in zip(got[:2], want[:2]):
            assert torch.equal(g, w), i
        assert got[4] == want[4]
    counts = {k: cudagraphs.counters[k] - before.get(k, 0) for k in ("captures", "replays")}
    # A capture is followed by its first replay: 2 + 1 + 1 calls with n=3, 1 + 1 with n=4.
    assert counts == {"captures": 2, "replays": 5}, counts
