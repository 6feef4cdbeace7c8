"""Unboxed routes (csrc/aten/unboxed_route.h) behave exactly as the boxed path.

The hottest operators have a kernel with their own C++ signature that calls
the native kernel directly, and a per-thread cache of native views. Routing
semantics (counts, routes, the dispatch log, the fallback policy) and tensor
semantics (in-place identity, out= resizing, aliasing, metadata changed in
place) must not depend on which path ran a call.
"""

import contextlib
import threading

import pytest
import torch

import torch_fl
from conftest import run_py

HOST = {"FLAGOS_ACCELERATOR": "host"}


def unboxed_ops():
    regs = set(torch_fl.get_registered_ops())
    return {op for op in ("aten::add.Tensor", "aten::mul.Tensor", "aten::mm", "aten::cat",
                          "aten::_softmax", "aten::index_select") if op in regs}


def test_hot_operators_have_unboxed_kernels():
    # Registered where the native device has a kernel of its own.
    assert unboxed_ops() == {"aten::add.Tensor", "aten::mul.Tensor", "aten::mm", "aten::cat",
                             "aten::_softmax", "aten::index_select"}


def test_every_call_is_counted_once_whichever_path_ran_it():
    a = torch.randn(5, device="flagos")
    b = torch.randn(5, device="flagos")
    # The first call of a new FlagGems kernel key runs FlagGems' Python wrapper
    # (counted as flaggems-python) while the C++ launcher learns the kernel.
    a + b
    torch_fl.routing.reset_stats()
    for _ in range(17):
        a + b
    stats = {s.op: s.calls for s in torch_fl.routing.stats()}
    backend = "native" if torch_fl.driver() == "host" else torch_fl.routing.table("add.Tensor")[0].backend
    assert stats["aten::add.Tensor"] == {backend: 17}


def test_route_changes_reach_calls_the_unboxed_path_served():
    a = torch.randn(5, device="flagos")
    a + a  # resolved, now served unboxed
    try:
        torch_fl.routing.set_route("add.Tensor", "cpu")
        torch_fl.routing.reset_stats()
        out = a + a
        stats = {s.op: s.calls for s in torch_fl.routing.stats()}
        assert stats["aten::add.Tensor"] == {"cpu": 1}
        torch.testing.assert_close(out.cpu(), a.cpu() * 2, rtol=0, atol=0)
    finally:
        torch_fl.routing.set_route("add.Tensor", "")


def test_in_place_and_out_calls_return_the_callers_tensors():
    x = torch.randn(4, 3, device="flagos")
    ref = x.cpu() + 1.5
    y = x.add_(1.5)
    assert y is x
    torch.testing.assert_close(x.cpu(), ref, rtol=0, atol=0)
    a, b = torch.randn(6, device="flagos"), torch.randn(6, device="flagos")
    out = torch.empty(0, device="flagos")
    r = torch.add(a, b, out=out)
    assert r is out and out.shape == (6,)
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu(), rtol=0, atol=0)
    big = torch.empty(6, device="flagos")
    storage = big.untyped_storage().data_ptr()
    torch.mul(a, b, out=big)
    assert big.untyped_storage().data_ptr() == storage  # no reallocation when it fits


@pytest.mark.parametrize("made_by", ["copy", "routed op"])
def test_cached_views_follow_metadata_changed_in_place(made_by):
    # A tensor's native view is cached by the thread, or, for a routed op's
    # result, kept by the result itself (runtime/result_tensor.h); either must
    # be given up once the tensor's metadata no longer matches it.
    g = torch.Generator().manual_seed(1)
    cpu = torch.randn(4, 6, generator=g)
    x = cpu.to("flagos") if made_by == "copy" else cpu.to("flagos") * 1
    torch.testing.assert_close((x * 2).cpu(), cpu * 2)  # the view of x is now cached
    x.unsqueeze_(0)
    cpu.unsqueeze_(0)
    torch.testing.assert_close((x * 2).cpu(), cpu * 2)
    x.squeeze_(0)
    cpu.squeeze_(0)
    x.t_()
    cpu.t_()
    torch.testing.assert_close((x * 2).cpu(), cpu * 2)
    x.resize_(3, 8)
    cpu.resize_(3, 8)
    torch.testing.assert_close((x * 2).cpu(), cpu * 2)
    other = torch.randn(3, 8, generator=g)
    x.set_(other.to("flagos"))
    torch.testing.assert_close((x * 2).cpu(), other * 2)
    x.untyped_storage().resize_(x.numel() * 4 * 2)  # new memory behind the same storage
    x.copy_(other.to("flagos"))
    torch.testing.assert_close((x + x).cpu(), other * 2)


def test_results_of_one_op_feed_the_next_and_views_alias_their_base():
    g = torch.Generator().manual_seed(2)
    cpu = torch.randn(8, 8, generator=g)
    x = cpu.to("flagos")
    y = torch.softmax(x @ x, -1) * x
    torch.testing.assert_close(y.cpu(), torch.softmax(cpu @ cpu, -1) * cpu)
    v = y[2:5]
    v.mul_(0)
    assert y.cpu()[2:5].abs().max() == 0
    s = torch.cat([y, y], 0)
    s[0].fill_(7)
    assert y.cpu()[0].ne(7).any()  # cat copies


@pytest.mark.parametrize("case", ["plain", "channels_last", "transposed", "conj", "inference"])
def test_results_carry_the_metadata_of_tensors_made_on_flagos(case):
    # A routed op's result is made from the native kernel's own tensor
    # (runtime/result_tensor.h): its keys, geometry, contiguity flags and
    # version counter must be those of the same result made on the CPU, moved.
    g = torch.Generator().manual_seed(5)
    dtype = torch.complex64 if case == "conj" else torch.float32
    cpu = torch.randn(2, 3, 4, 5, generator=g, dtype=dtype)
    if case == "channels_last":
        cpu = cpu.contiguous(memory_format=torch.channels_last)
    if case == "transposed":
        cpu = cpu.transpose(1, 3)
    x = cpu.to("flagos")  # keeps the memory format
    if case == "conj":
        x, cpu = x.conj(), cpu.conj()
    mode = torch.inference_mode() if case == "inference" else contextlib.nullcontext()
    with mode:
        y, ref = x * 2, cpu * 2
        keys = torch._C._dispatch_keys(torch.empty(1, device="flagos", dtype=dtype))
    assert y.device.type == "flagos" and y.dtype == ref.dtype
    assert (y.shape, y.stride(), y.storage_offset()) == (ref.shape, ref.stride(), ref.storage_offset())
    for fmt in (torch.contiguous_format, torch.channels_last):
        assert y.is_contiguous(memory_format=fmt) == ref.is_contiguous(memory_format=fmt)
    assert y.is_conj() == ref.is_conj() and y.is_inference() == ref.is_inference()
    assert torch._C._dispatch_keys(y.resolve_conj() if case == "conj" else y) == keys
    torch.testing.assert_close(y.cpu(), ref)
    if case != "inference":
        assert y._version == 0
        y.add_(1)  # a routed in-place op bumps the result's own counter once
        assert y._version == 1 and x._version == 0
        torch.testing.assert_close(y.cpu(), ref + 1)
        w = torch.randn(3, device="flagos", requires_grad=True)
        h = w * 3
        h.exp_()  # exp_ saves its result: a later in-place change must be caught
        h.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            h.sum().backward()


def test_same_device_errors_are_the_boxed_paths():
    a = torch.randn(3, device="flagos")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.randn(3)
    torch.testing.assert_close((a + torch.tensor(2.0)).cpu(), a.cpu() + 2)  # a CPU scalar is fine
    if torch.flagos.device_count() > 1:
        with pytest.raises(RuntimeError, match="flagos:0 and flagos:1"):
            torch.randn(3, device="flagos:0") + torch.randn(3, device="flagos:1")


def test_threads_share_tensors_and_get_correct_results():
    g = torch.Generator().manual_seed(3)
    cpu = [torch.randn(16, 16, generator=g) for _ in range(4)]
    dev = [t.to("flagos") for t in cpu]
    errors = []

    def work(k):
        try:
            for i in range(200):
                a, b = dev[(i + k) % 4], dev[(i + 2 * k + 1) % 4]
                r = (a @ b + a) * b
                if i % 50 == 0:
                    ca, cb = cpu[(i + k) % 4], cpu[(i + 2 * k + 1) % 4]
                    torch.testing.assert_close(r.cpu(), (ca @ cb + ca) * cb)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_dispatch_log_and_fallback_policy_see_unboxed_operators():
    code = """
import torch, torch_fl
a = torch.randn(4, device="flagos")
for _ in range(3):
    a + a
print("OK")
"""
    rc, out, err = run_py(code, env={**HOST, "FLAGOS_LOG_DISPATCH": "1"})
    assert rc == 0, err
    assert err.count("aten::add.Tensor -> native") == 1, err
    code = """
import torch, torch_fl
a = torch.randn(4, device="flagos")
try:
    a + a
except RuntimeError as e:
    print("RAISED", "add.Tensor" in str(e))
"""
    rc, out, err = run_py(code, env={**HOST, "FLAGOS_CONFIG_STRICT": "0", "FLAGOS_OP_add": "cuda",
                                     "FLAGOS_CPU_FALLBACK": "error"})
    assert rc == 0, err
    assert "RAISED True" in out, (out, err)


@pytest.mark.parametrize("route", ["", "cpu"], ids=["unboxed", "boxed-cpu-route"])
def test_long_tensor_lists_keep_aliasing_and_results(route):
    # Past a few tensors a call's views and storages are looked up by hash
    # (aten/pointer_index.h), and past the view cache's reach views are made
    # afresh: lists of every parameter (an optimizer's `_foreach_*` step) and
    # `cat` of many tensors. Views of one base share a storage, repeats share
    # a view; both must survive as on the CPU.
    n = 70
    g = torch.Generator().manual_seed(1234)
    base = torch.randn(n, 3, generator=g)
    others = [torch.randn(3, generator=g) for _ in range(n)]

    def lists(device):
        b = base.clone().to(device)  # .to("cpu") alone would hand back `base`
        rows = [b[i] for i in range(n)]  # n views of one storage
        rest = [t.clone().to(device) for t in others]
        return b, rows, rest

    # Where the native device has no foreach kernels (the CPU), PyTorch runs
    # the foreach composites per tensor, and their parts are what is routed.
    ops = ["cat"]
    for foreach, parts in (("_foreach_add_.List", "add_.Tensor"), ("_foreach_mul.Scalar", "mul.Tensor")):
        try:
            torch_fl.routing.set_route(foreach, route or "")
            ops.append(foreach)
        except ValueError as e:
            assert "never reaches flagos routing" in str(e)
            ops.append(parts)
    try:
        for op in ops:
            torch_fl.routing.set_route(op, route)
        for side in ("cpu", "flagos"):
            b, rows, rest = lists(side)
            mixed = rows[::2] + rest + rows[::3] + [rest[0]] * 5
            cat = torch.cat(mixed)
            torch._foreach_add_(rows, rest)  # writes through every view into `b`
            scaled = torch._foreach_mul(rows + rest, 0.5)
            if side == "cpu":
                want = (cat, b, scaled)
            else:
                torch.testing.assert_close(cat.cpu(), want[0], rtol=0, atol=0)
                torch.testing.assert_close(b.cpu(), want[1], rtol=0, atol=0)
                assert len(scaled) == len(want[2])
                for got, ref in zip(scaled, want[2]):
                    assert got.device.type == "flagos"
                    torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
                # Results are fresh memory, not the arguments'.
                assert all(s.data_ptr() != r.data_ptr() for s, r in zip(scaled, rows))
    finally:
        for op in ops:
            torch_fl.routing.set_route(op, "")


def test_arguments_are_released_with_the_call():
    # The unboxed routes borrow their native views (aten/unboxed_route.h): a
    # plain tensor, an optional one and list elements take no reference count
    # of their own. Every borrow must be given back without dropping one, also
    # when a conversion fails halfway through a list: a count dropped twice
    # frees a view, and with it a twin, under a live tensor (scripts/sanitize.sh
    # runs this file under AddressSanitizer, which reports the use after free),
    # and the memory of the call's tensors must all come back.
    g = torch.Generator().manual_seed(11)
    cpu = [torch.randn(6, 8, generator=g) for _ in range(12)]
    weight, bias = torch.randn(8, generator=g), torch.randn(8, generator=g)
    idx = torch.tensor([5, 0, 3])

    def work():
        xs = [t.to("flagos") for t in cpu]
        w, b, i = weight.to("flagos"), bias.to("flagos"), idx.to("flagos")
        out = [torch.cat(xs + [x.t().contiguous().t() for x in xs[:3]]),  # a list
               torch.layer_norm(xs[0], (8,), w, b),  # optional tensors
               torch.layer_norm(xs[1], (8,), None, b),
               torch.index_select(xs[2].t(), 1, i),  # a fresh view
               torch.where(xs[3] > 0, xs[3], xs[4])]
        if torch.flagos.device_count() > 1:
            other = torch.randn(6, 8, device="flagos:1")
            with pytest.raises(RuntimeError, match="same device"):
                torch.cat(xs[:5] + [other] + xs[5:])
        return [o.cpu() for o in out]

    got = work()
    want = [torch.cat(cpu + cpu[:3]), torch.layer_norm(cpu[0], (8,), weight, bias),
            torch.layer_norm(cpu[1], (8,), None, bias), torch.index_select(cpu[2].t(), 1, idx),
            torch.where(cpu[3] > 0, cpu[3], cpu[4])]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    allocated = torch.flagos.memory_allocated()
    for _ in range(20):
        work()
    assert torch.flagos.memory_allocated() == allocated
    for a, b in zip(work(), want):  # nothing freed under a live tensor
        torch.testing.assert_close(a, b)
