"""Tensors on flagos: creation, copies, views, aliasing, out=, resize/set_, indexing, storage."""

import warnings

import pytest
import torch

DEV = torch.device("flagos", 0)
DEV1 = torch.device("flagos", 1)

# The conj/neg-view child process (it crashes today) starts with the first
# test of this module and runs alongside the in-process tests.
pytestmark = pytest.mark.usefixtures("conj_neg_run")


def assert_same(actual, expected, rtol=0.0, atol=0.0):
    """actual (any device) equals the CPU reference ``expected`` in dtype, shape and values."""
    assert actual.dtype == expected.dtype
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol)


def same_memory(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


# ---------------------------------------------------------------- creation


def test_empty_has_requested_shape_dtype_device():
    t = torch.empty(3, 5, dtype=torch.float64, device="flagos")
    assert t.shape == (3, 5)
    assert t.dtype == torch.float64
    assert t.device == DEV
    assert t.is_contiguous()
    s = torch.empty_strided((2, 3), (1, 2), device="flagos")
    assert s.stride() == (1, 2) and s.device == DEV


@pytest.fixture
def deterministic():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(was)


def test_deterministic_mode_fills_new_memory_as_cpu_does(deterministic):
    # NaN for floating types, the maximum for integers: empty, empty_strided,
    # empty_like and the grown part of resize_.
    for dtype in (torch.float32, torch.bfloat16, torch.complex64, torch.int32, torch.uint8,
                  torch.bool):
        made = (torch.empty(5, dtype=dtype, device="flagos"),
                torch.empty_strided((2, 3), (1, 2), dtype=dtype, device="flagos"),
                torch.empty_like(torch.ones(4, dtype=dtype, device="flagos")))
        for t in made:
            want = torch.empty(t.shape, dtype=dtype)  # the CPU's fill, same mode
            torch.testing.assert_close(t.cpu(), want, equal_nan=True, rtol=0, atol=0)
    t = torch.arange(3, dtype=torch.float32, device="flagos")
    t.resize_(6)
    torch.testing.assert_close(t.cpu()[:3], torch.arange(3, dtype=torch.float32))
    assert torch.isnan(t.cpu()[3:]).all()
    i = torch.arange(2, dtype=torch.int64, device="flagos")
    i.resize_(5)
    assert i.cpu().tolist() == [0, 1] + [torch.iinfo(torch.int64).max] * 3


def test_empty_zero_size():
    t = torch.empty(0, 4, device="flagos")
    assert t.shape == (0, 4) and t.numel() == 0
    assert t.cpu().shape == (0, 4)


@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.zeros(4, 3, device=d),
        lambda d: torch.ones(2, 7, dtype=torch.int64, device=d),
        lambda d: torch.full((3, 3), 2.5, device=d),
        lambda d: torch.full((5,), -7, dtype=torch.int32, device=d),
        lambda d: torch.arange(0, 17, 3, device=d),
        lambda d: torch.arange(0.5, 4.0, 0.25, dtype=torch.float64, device=d),
        lambda d: torch.eye(4, 6, device=d),
        lambda d: torch.linspace(-1.0, 3.0, 11, device=d),
        lambda d: torch.tensor([[1.5, -2.0], [3.25, 4.0]], device=d),
        lambda d: torch.tensor([True, False, True], device=d),
        lambda d: torch.zeros_like(torch.empty(2, 2), device=d),
    ],
    ids=["zeros", "ones_int64", "full", "full_int32", "arange_int", "arange_f64",
         "eye", "linspace", "tensor_list", "tensor_bool", "zeros_like"],
)
def test_deterministic_factories_match_cpu(make):
    actual = make("flagos")
    assert actual.device == DEV
    assert_same(actual, make("cpu"), rtol=1e-6, atol=1e-6)


def test_factories_honour_explicit_device_index():
    for make in (torch.zeros, torch.ones, torch.randn, torch.rand, torch.empty):
        t = make(3, device="flagos:1")
        assert t.device == DEV1


def test_randn_has_normal_statistics():
    t = torch.randn(200_000, device="flagos")
    assert t.device == DEV and t.dtype == torch.float32
    c = t.cpu()
    assert abs(c.mean().item()) < 0.02
    assert abs(c.std().item() - 1.0) < 0.02


def test_rand_is_in_unit_interval_and_uniform():
    c = torch.rand(100_000, device="flagos").cpu()
    assert c.min().item() >= 0.0 and c.max().item() < 1.0
    assert abs(c.mean().item() - 0.5) < 0.01


def test_randint_respects_bounds_and_covers_range():
    t = torch.randint(-3, 5, (10_000,), device="flagos")
    assert t.device == DEV and t.dtype == torch.int64
    values = set(t.cpu().tolist())
    assert values == set(range(-3, 5))


# ---------------------------------------------------------------- copies


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16,
                                   torch.bfloat16, torch.int32, torch.int64,
                                   torch.uint8, torch.bool, torch.complex64])
def test_cpu_flagos_cpu_round_trip_is_exact(dtype):
    src = (torch.randn(7, 9) * 50).to(dtype)
    f = src.to("flagos")
    assert f.device == DEV and f.dtype == dtype
    back = f.to("cpu")
    assert back.device.type == "cpu"
    assert torch.equal(back, src)


def test_copy_does_not_alias_source():
    src = torch.randn(10)
    original = src.clone()
    f = src.to("flagos")
    src.add_(1)
    assert torch.equal(f.cpu(), original)
    g = f.clone()
    f.mul_(0)
    assert torch.equal(g.cpu(), original)
    assert torch.count_nonzero(f.cpu()) == 0


def test_flagos_to_flagos_copy_same_device():
    src = torch.randn(6, 4, device="flagos")
    dst = torch.empty(6, 4, device="flagos")
    dst.copy_(src)
    assert_same(dst, src.cpu())
    assert not same_memory(dst, src)


def test_flagos_copy_across_devices():
    src_cpu = torch.randn(5, 3)
    src = src_cpu.to("flagos:0")
    moved = src.to("flagos:1")
    assert moved.device == DEV1
    assert_same(moved, src_cpu)
    back = moved.to("flagos:0")
    assert back.device == DEV
    assert_same(back, src_cpu)
    dst = torch.zeros(5, 3, device="flagos:1")
    dst.copy_(src)
    assert_same(dst, src_cpu)
    assert dst.device == DEV1


@pytest.mark.parametrize(
    "src_dtype,dst_dtype",
    [(torch.float32, torch.float64), (torch.float32, torch.float16),
     (torch.float64, torch.int32), (torch.int64, torch.float32),
     (torch.float32, torch.bfloat16), (torch.int32, torch.bool)],
)
def test_dtype_converting_copies(src_dtype, dst_dtype):
    src_cpu = (torch.randn(4, 6) * 10).to(src_dtype)
    expected = src_cpu.to(dst_dtype)
    # cpu -> flagos with conversion
    assert_same(src_cpu.to("flagos", dtype=dst_dtype), expected)
    # flagos -> flagos with conversion
    assert_same(src_cpu.to("flagos").to(dst_dtype), expected)
    # flagos -> cpu with conversion
    assert_same(src_cpu.to("flagos").to("cpu", dtype=dst_dtype), expected)
    # copy_ into an existing tensor of another dtype
    dst = torch.empty(4, 6, dtype=dst_dtype, device="flagos")
    dst.copy_(src_cpu)
    assert_same(dst, expected)


def test_conversions_of_flagos_tensors_match_cpu_layouts():
    # flagos -> flagos conversions run the native device's _to_copy on the
    # native view (aten/copy.cpp); others keep PyTorch's composite. Both must
    # give CPU's values, strides (memory_format=preserve keeps a dense
    # permutation, makes a non-dense view contiguous) and fresh memory.
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, 5, generator=g) * 8
    sources = {
        "contiguous": lambda t: t,
        "transposed": lambda t: t.transpose(0, 2),
        "sliced": lambda t: t[:, ::2, 1:],
        "expanded": lambda t: t[:1].expand(3, 6, 5),
    }
    conversions = {
        "to(float64)": lambda t: t.to(torch.float64),
        "to(bfloat16)": lambda t: t.to(torch.bfloat16),
        "to(int32)": lambda t: t.to(torch.int32),
        "to(copy=True)": lambda t: t.to(t.dtype, copy=True),
        "to(contiguous_format)": lambda t: t.to(torch.float16, memory_format=torch.contiguous_format),
        "to(flagos:0, float64)": lambda t: t.to(DEV, torch.float64) if t.is_flagos else t.double(),
        "to(flagos:1, float16)": lambda t: t.to(DEV1, torch.float16) if t.is_flagos else t.half(),
        "half()": lambda t: t.half(),
    }
    src_flagos = base.to(DEV)
    for sname, view in sources.items():
        for cname, convert in conversions.items():
            want = convert(view(base))
            src = view(src_flagos)
            got = convert(src)
            assert got.device.type == "flagos", (sname, cname)
            assert got.stride() == want.stride(), (sname, cname, got.stride(), want.stride())
            assert_same(got, want)
            assert not same_memory(got, src), (sname, cname)
    # The conversion is a copy: writing the source afterwards leaves it alone.
    src = base.to(DEV)
    converted = src.to(torch.float64)
    src.add_(1)
    assert_same(converted, base.double())
    # And it is differentiable as on the CPU.
    x = base.to(DEV).requires_grad_()
    (x.to(torch.float64) * 2).sum().backward()
    assert_same(x.grad, torch.full_like(base, 2.0))


def test_non_contiguous_source_copies():
    base = torch.randn(6, 8)
    f = base.to("flagos")
    for make in (lambda t: t.t(), lambda t: t[:, ::2], lambda t: t[1:5, 2:7],
                 lambda t: t[::3, 1::2].t()):
        # cpu non-contiguous -> flagos
        assert_same(make(base).to("flagos"), make(base))
        # flagos non-contiguous -> cpu
        view = make(f)
        assert view.stride() == make(base).stride()
        assert_same(view.cpu(), make(base))
        # flagos non-contiguous -> flagos
        assert_same(view.contiguous(), make(base))
        assert view.contiguous().is_contiguous()


def test_copy_into_non_contiguous_destination():
    base_cpu = torch.randn(5, 4)
    dst = base_cpu.to("flagos")
    src = torch.randn(4, 5)
    dst.t().copy_(src)
    expected = base_cpu.clone()
    expected.t().copy_(src)
    assert_same(dst, expected)

    dst2 = torch.randn(6, 6).to("flagos")
    ref = dst2.cpu()
    patch = torch.randn(3, 3)
    dst2[::2, 1::2].copy_(patch.to("flagos"))
    ref[::2, 1::2].copy_(patch)
    assert_same(dst2, ref)


def test_copy_broadcasts_source():
    dst = torch.empty(3, 4, device="flagos")
    row = torch.randn(4)
    dst.copy_(row)
    assert_same(dst, row.expand(3, 4).contiguous())
    dst.copy_(row.to("flagos"))
    assert_same(dst, row.expand(3, 4).contiguous())


def _outcome(fn):
    """('ok', result on the CPU) or (exception type, None)."""
    try:
        return "ok", fn().cpu()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e), None


@pytest.mark.parametrize("case", ["dtype", "transposed src", "into slice", "self", "alias",
                                  "internal overlap", "partial overlap", "meta src",
                                  "cpu dst", "complex conj"])
def test_copy_matches_cpu_values_and_errors(case):
    """flagos' own copy_ kernel (and the composite it leaves some pairs to)
    gives what CPU's copy_ gives, or the same type of error."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, 5, generator=g)

    def run(dev):
        a = x.to(dev)
        if case == "dtype":
            return torch.empty(6, 5, dtype=torch.float16, device=dev).copy_(a)
        if case == "transposed src":
            return torch.empty(5, 6, dtype=torch.float64, device=dev).copy_(a.t())
        if case == "into slice":
            d = torch.zeros(8, 5, device=dev)
            d[1:7].copy_(a)
            return d
        if case == "self":
            return a.copy_(a)
        if case == "alias":  # the same memory and geometry through another tensor
            a.t().t().copy_(a.mul(2))
            return a.view(30).copy_(a.t().t().view(30))
        if case == "internal overlap":
            return torch.zeros(1, device=dev).expand(5).copy_(a[0])
        if case == "partial overlap":
            return a[1:].copy_(a[:-1])
        if case == "meta src":
            return a.copy_(torch.empty(6, 5, device="meta"))
        if case == "cpu dst":
            return torch.empty(5, 6).copy_(a.t())
        if case == "complex conj":
            c = torch.complex(a, a.flip(1))
            return torch.empty_like(c).copy_(c.conj())
        raise AssertionError(case)

    flagos_kind, flagos_value = _outcome(lambda: run("flagos"))
    cpu_kind, cpu_value = _outcome(lambda: run("cpu"))
    assert flagos_kind == cpu_kind
    if cpu_kind == "ok":
        assert_same(flagos_value, cpu_value)


def test_copy_into_slices_in_backward_matches_cpu():
    """Slice, select and expand backward copy gradients into slices: the
    gradients equal CPU's (float64 reference, explicit tolerance)."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(8, 6, generator=g, dtype=torch.float64)
    w = torch.randn(6, generator=g, dtype=torch.float64)

    def grads(dev):
        xs, ws = x.to(dev).requires_grad_(), w.to(dev).requires_grad_()
        y = (xs[2:7, 1:] * ws[1:]).sum() + xs[3].pow(2).sum() + ws.expand(4, 6).sum()
        y.backward()
        return xs.grad.cpu(), ws.grad.cpu()

    for got, want in zip(grads("flagos"), grads("cpu")):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_non_blocking_copies_are_correct_after_synchronize():
    last = torch.flagos.device_count() - 1  # 1 with two devices
    src = torch.randn(1000, 33)
    f = src.to("flagos", non_blocking=True)
    g = f.to(f"flagos:{last}", non_blocking=True)
    back = torch.empty_like(src)
    back.copy_(g, non_blocking=True)
    torch.flagos.synchronize()
    torch.flagos.synchronize(last)
    assert torch.equal(back, src)
    host = f.to("cpu", non_blocking=True)
    torch.flagos.synchronize()
    assert torch.equal(host, src)


# ---------------------------------------------------------------- views


VIEW_OPS = {
    "view": lambda t: t.view(4, 30),
    "view_flat": lambda t: t.view(-1),
    "reshape": lambda t: t.reshape(6, 20),
    "transpose": lambda t: t.transpose(0, 2),
    "narrow": lambda t: t.narrow(1, 1, 3),
    "select": lambda t: t.select(2, 3),
    "expand": lambda t: t[:, :1, :].expand(2, 6, 10),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "as_strided": lambda t: t.as_strided((3, 4), (7, 2), 5),
    "unfold": lambda t: t.unfold(2, 2, 1),
    "diagonal": lambda t: t.diagonal(0, 1, 2),
    "permute": lambda t: t.permute(2, 0, 1),
    "squeeze": lambda t: t[:, :1].squeeze(1),
    "t_of_select": lambda t: t[0].t(),
    "split": lambda t: t.split(2, dim=1)[1],
    "chunk": lambda t: t.chunk(3, dim=2)[2],
    "slice_step": lambda t: t[..., ::2],
}


@pytest.mark.parametrize("name", list(VIEW_OPS))
def test_view_ops_match_cpu_and_alias_base(name):
    op = VIEW_OPS[name]
    base_cpu = torch.randn(2, 6, 10)
    base = base_cpu.to("flagos")
    expected = op(base_cpu)
    v = op(base)
    assert v.device == DEV
    assert v.shape == expected.shape
    assert v.stride() == expected.stride()
    assert v.storage_offset() == expected.storage_offset()
    assert_same(v, expected)
    assert v._base is base or v._is_view()
    assert same_memory(v, base)


def test_split_and_chunk_return_all_pieces():
    base_cpu = torch.randn(7, 4)
    base = base_cpu.to("flagos")
    for pieces, ref in ((base.split(3), base_cpu.split(3)),
                        (base.chunk(3, dim=1), base_cpu.chunk(3, dim=1)),
                        (base.split([1, 2, 4]), base_cpu.split([1, 2, 4])),
                        (base.unbind(1), base_cpu.unbind(1))):
        assert len(pieces) == len(ref)
        for p, r in zip(pieces, ref):
            assert_same(p, r)
            assert same_memory(p, base)


def test_write_through_view_is_visible_in_base():
    base_cpu = torch.randn(4, 6)
    base = base_cpu.to("flagos")
    base.t()[2].fill_(7.0)
    base[1:3, ::2].mul_(-1)
    base.view(-1)[5] = 3.5
    base.diagonal().add_(100)
    ref = base_cpu.clone()
    ref.t()[2].fill_(7.0)
    ref[1:3, ::2].mul_(-1)
    ref.view(-1)[5] = 3.5
    ref.diagonal().add_(100)
    assert_same(base, ref)


def test_write_to_base_is_visible_in_view():
    base = torch.randn(3, 8, device="flagos")
    v = base[:, 2:5].t()
    before = v.cpu().clone()
    base.add_(1.0)
    torch.testing.assert_close(v.cpu(), before + 1.0, rtol=0, atol=1e-6)
    base.zero_()
    assert torch.count_nonzero(v.cpu()) == 0


def test_in_place_ops_return_self_and_write_in_place():
    a_cpu = torch.randn(5, 5)
    a = a_cpu.to("flagos")
    ptr = a.data_ptr()
    r = a.mul_(2).add_(1).clamp_(-1, 1)
    assert r is a
    assert a.data_ptr() == ptr
    assert_same(a, a_cpu.mul(2).add(1).clamp(-1, 1), rtol=1e-6, atol=1e-6)


def test_version_counter_increments_on_in_place_ops():
    x = torch.randn(4, device="flagos")
    v0 = x._version
    x.add_(1)
    assert x._version == v0 + 1
    x[0] = 5.0
    assert x._version == v0 + 2
    view = x[1:]
    view.mul_(2)
    assert x._version == view._version == v0 + 3
    torch.add(x, 1, out=x)
    assert x._version == v0 + 4
    y = x + 1  # out-of-place: no bump
    assert x._version == v0 + 4
    assert y._version == 0


# ---------------------------------------------------------------- out=


def test_out_argument_right_shape_is_written_in_place():
    a_cpu, b_cpu = torch.randn(4, 5), torch.randn(4, 5)
    a, b = a_cpu.to("flagos"), b_cpu.to("flagos")
    out = torch.empty(4, 5, device="flagos")
    ptr = out.data_ptr()
    r = torch.add(a, b, out=out)
    assert r is out
    assert out.data_ptr() == ptr
    assert_same(out, a_cpu + b_cpu, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("out_shape", [(0,), (3,), (2, 2), (7, 9)],
                         ids=["empty", "too_small", "too_small_2d", "too_big"])
def test_out_argument_wrong_shape_is_resized(out_shape):
    a_cpu, b_cpu = torch.randn(4, 5), torch.randn(4, 5)
    a, b = a_cpu.to("flagos"), b_cpu.to("flagos")
    out = torch.randn(out_shape).to("flagos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "An output ... was resized"
        r = torch.add(a, b, out=out)
    assert r is out
    assert out.shape == (4, 5)
    assert out.device == DEV
    assert_same(out, a_cpu + b_cpu, rtol=1e-6, atol=1e-6)
    # the resized out is an ordinary flagos tensor afterwards
    assert_same(out * 2, (a_cpu + b_cpu) * 2, rtol=1e-6, atol=1e-6)


def test_out_argument_resize_keeps_other_views_consistent():
    a = torch.randn(64, device="flagos")
    out = torch.empty(0, device="flagos")
    torch.mul(a, 3.0, out=out)
    assert out.untyped_storage().nbytes() >= 64 * 4
    assert out.untyped_storage().device.type == "flagos"
    alias = out.view(8, 8)
    alias[0, 0] = -1.0
    assert out[0].item() == -1.0


def test_out_argument_matmul_and_reductions():
    a_cpu, b_cpu = torch.randn(6, 3), torch.randn(3, 4)
    out = torch.empty(1, device="flagos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.matmul(a_cpu.to("flagos"), b_cpu.to("flagos"), out=out)
    assert_same(out, a_cpu @ b_cpu, rtol=1e-5, atol=1e-5)
    s = torch.empty(6, device="flagos")
    torch.sum(a_cpu.to("flagos"), dim=1, out=s)
    assert_same(s, a_cpu.sum(1), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- resize_ / set_


def test_resize_growing_keeps_prior_data():
    src = torch.randn(6)
    x = src.to("flagos")
    x.resize_(4, 5)
    assert x.shape == (4, 5)
    assert x.untyped_storage().nbytes() >= 20 * 4
    torch.testing.assert_close(x.view(-1)[:6].cpu(), src, rtol=0, atol=0)
    x.fill_(1.5)
    assert torch.all(x.cpu() == 1.5)


def test_resize_shrinking_keeps_prefix():
    src = torch.randn(3, 4)
    x = src.to("flagos")
    x.resize_(5)
    torch.testing.assert_close(x.cpu(), src.view(-1)[:5], rtol=0, atol=0)


def test_resize_on_device_1_stays_on_device_1():
    src = torch.randn(3)
    x = src.to("flagos:1")
    x.resize_(100)
    assert x.device == DEV1
    torch.testing.assert_close(x[:3].cpu(), src, rtol=0, atol=0)


def test_set_to_another_tensors_storage_aliases_it():
    src_cpu = torch.randn(12)
    src = src_cpu.to("flagos")
    y = torch.empty(0, device="flagos")
    y.set_(src.untyped_storage(), 2, (2, 3), (3, 1))
    assert y.shape == (2, 3)
    assert y.storage_offset() == 2
    assert same_memory(y, src)
    assert_same(y, src_cpu[2:8].view(2, 3))
    y.fill_(0.25)
    torch.testing.assert_close(src[2:8].cpu(), torch.full((6,), 0.25), rtol=0, atol=0)


def test_set_to_another_tensor():
    src_cpu = torch.randn(3, 4)
    src = src_cpu.to("flagos")
    y = torch.randn(2, device="flagos")
    y.set_(src.t())
    assert y.shape == (4, 3)
    assert y.stride() == (1, 4)
    assert same_memory(y, src)
    assert_same(y, src_cpu.t())
    src.mul_(2)
    assert_same(y, src_cpu.t() * 2)


def test_set_whole_storage_and_empty():
    src = torch.randn(10, device="flagos")
    y = torch.empty(0, device="flagos")
    y.set_(src.untyped_storage())
    assert y.shape == (10,)
    assert torch.equal(y.cpu(), src.cpu())
    y.set_()
    assert y.numel() == 0
    assert y.device == DEV


def test_set_rejects_cpu_storage():
    y = torch.empty(0, device="flagos")
    with pytest.raises(RuntimeError):
        y.set_(torch.randn(4).untyped_storage())


# ---------------------------------------------------------------- scalars


def test_item_and_tolist():
    src = torch.randn(3, 2)
    f = src.to("flagos")
    assert f[1, 1].item() == src[1, 1].item()
    assert f.tolist() == src.tolist()
    i = torch.tensor(-42, device="flagos")
    assert i.item() == -42 and isinstance(i.item(), int)
    b = torch.tensor([True], device="flagos")
    assert b.item() is True
    d = torch.tensor(0.1, dtype=torch.float64, device="flagos")
    assert d.item() == 0.1
    assert float(f.sum()) == pytest.approx(src.sum().item(), rel=1e-5, abs=1e-5)
    assert bool((f > 100).any()) is False


def test_item_of_non_contiguous_element_on_device_1():
    src = torch.randn(4, 5)
    f = src.to("flagos:1")
    assert f.t()[3, 2].item() == src.t()[3, 2].item()
    assert f[2:, 3][1].item() == src[3, 3].item()


# ---------------------------------------------------------------- indexing


def test_getitem_with_mask_and_index_tensors():
    src = torch.randn(6, 5)
    f = src.to("flagos")
    mask = src > 0
    assert_same(f[mask.to("flagos")], src[mask])
    idx = torch.tensor([4, 0, 2, 2])
    assert_same(f[idx.to("flagos")], src[idx])
    assert_same(f[:, idx.to("flagos")], src[:, idx])
    assert_same(f[idx.to("flagos"), 1:3], src[idx, 1:3])
    rows, cols = torch.tensor([0, 5, 3]), torch.tensor([4, 1, 1])
    assert_same(f[rows.to("flagos"), cols.to("flagos")], src[rows, cols])
    assert_same(f[[1, 3]], src[[1, 3]])


def test_setitem_with_mask_and_index_tensors():
    src = torch.randn(6, 5)
    f = src.to("flagos")
    ref = src.clone()
    mask = src < 0
    f[mask.to("flagos")] = 0.0
    ref[mask] = 0.0
    idx = torch.tensor([1, 4])
    vals = torch.randn(2, 5)
    f[idx.to("flagos")] = vals.to("flagos")
    ref[idx] = vals
    f[:, 2] = torch.arange(6.0).to("flagos")
    ref[:, 2] = torch.arange(6.0)
    assert_same(f, ref)


def test_index_put_accumulate_and_index_add():
    dst = torch.randn(5)
    idx = torch.tensor([0, 2, 2, 4, 0])
    vals = torch.randn(5)
    f = dst.to("flagos")
    f.index_put_((idx.to("flagos"),), vals.to("flagos"), accumulate=True)
    ref = dst.clone().index_put_((idx,), vals, accumulate=True)
    assert_same(f, ref, rtol=1e-6, atol=1e-6)
    g = dst.to("flagos").index_add_(0, idx.to("flagos"), vals.to("flagos"))
    assert_same(g, dst.clone().index_add_(0, idx, vals), rtol=1e-6, atol=1e-6)


def test_gather_scatter_where_nonzero():
    src = torch.randn(4, 6)
    f = src.to("flagos")
    idx = torch.randint(0, 6, (4, 3))
    assert_same(f.gather(1, idx.to("flagos")), src.gather(1, idx))
    z = torch.zeros(4, 6).to("flagos").scatter_(1, idx.to("flagos"), 1.0)
    assert_same(z, torch.zeros(4, 6).scatter_(1, idx, 1.0))
    assert_same(torch.where(f > 0, f, -f), src.abs())
    assert_same(f.nonzero(), src.nonzero())
    assert_same(torch.masked_select(f, f > 0.5), torch.masked_select(src, src > 0.5))


# ---------------------------------------------------------------- storage


def test_untyped_storage_of_flagos_tensor():
    last = torch.device("flagos", torch.flagos.device_count() - 1)  # flagos:1 with two
    x = torch.randn(3, 4, device=last)
    s = x.untyped_storage()
    assert s.device == last
    assert s.nbytes() == 12 * 4
    assert s.data_ptr() == x.data_ptr()
    assert x[1:].untyped_storage().data_ptr() == s.data_ptr()
    cpu_bytes = s.cpu()
    assert cpu_bytes.device.type == "cpu"
    assert bytes(cpu_bytes) == bytes(x.cpu().untyped_storage())


def test_untyped_storage_resize_keeps_data():
    src = torch.randn(8)
    x = src.to("flagos")
    s = x.untyped_storage()
    s.resize_(64 * 4)
    assert s.nbytes() == 64 * 4
    assert x.untyped_storage().nbytes() == 64 * 4
    assert torch.equal(x.cpu(), src)
    big = torch.empty(0, device="flagos").set_(s, 0, (64,), (1,))
    assert torch.equal(big[:8].cpu(), src)
    s.resize_(4 * 4)
    assert x.untyped_storage().nbytes() == 16
    assert torch.equal(torch.empty(0, device="flagos").set_(s, 0, (4,), (1,)).cpu(), src[:4])


def test_typed_storage_resize_keeps_data():
    src = torch.randn(5)
    x = src.to("flagos")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        st = x.storage()
        assert st.device.type == "flagos"
        assert st.size() == 5
        st.resize_(9)
        assert st.size() == 9
    assert x.untyped_storage().nbytes() == 9 * 4
    assert torch.equal(x.cpu(), src)


def test_storage_new_and_fill():
    s = torch.UntypedStorage(32, device="flagos")
    assert s.device == DEV and s.nbytes() == 32
    s.fill_(7)
    assert list(s.cpu()) == [7] * 32


# ---------------------------------------------------------------- devices mixed


def test_zero_dim_cpu_tensor_mixes_with_flagos_like_a_scalar():
    src = torch.randn(4, 4)
    f = src.to("flagos")
    r = f * torch.tensor(2.5)
    assert r.device == DEV
    assert_same(r, src * 2.5, rtol=1e-6, atol=1e-6)
    idx = torch.tensor([0, 2])  # CPU index tensors are accepted, as on CUDA
    assert_same(f[idx], src[idx])


def test_elementwise_op_mixing_cpu_and_flagos_raises():
    f = torch.randn(3, 3, device="flagos")
    with pytest.raises(RuntimeError, match="same device"):
        f + torch.randn(3, 3)
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(3, 3) * f


def test_ops_on_two_flagos_devices_raise():
    a = torch.randn(3, 3, device="flagos:0")
    b = torch.randn(3, 3, device="flagos:1")
    for op in (lambda: torch.mm(a, b), lambda: torch.cat([a, b]), lambda: a.add_(b)):
        with pytest.raises(RuntimeError, match="same device"):
            op()


def test_non_elementwise_ops_mixing_cpu_and_flagos_raise():
    f = torch.randn(3, 3, device="flagos")
    c = torch.randn(3, 3)
    ops = {
        "mm(flagos, cpu)": lambda: torch.mm(f, c),
        "mm(cpu, flagos)": lambda: torch.mm(c, f),
        "cat([flagos, cpu])": lambda: torch.cat([f, c]),
        "stack([cpu, flagos])": lambda: torch.stack([c, f]),
        "where(cpu mask, flagos, flagos)": lambda: torch.where(c > 0, f, f),
        "linear(flagos, cpu weight)": lambda: torch.nn.functional.linear(f, c),
    }
    accepted = []
    for name, op in ops.items():
        try:
            result = op()
        except RuntimeError as e:
            assert "device" in str(e), (name, str(e))
        else:
            accepted.append(f"{name} -> {result.device}")
    assert not accepted, "mixed-device ops were accepted: " + "; ".join(accepted)


# ---------------------------------------------------------------- conj / neg views

CONJ_NEG_SNIPPET = r"""
import torch, torch_fl
c = torch.randn(3, 4, dtype=torch.complex64)
f = c.to("flagos")
assert f.conj().is_conj()
assert torch.equal(f.conj().cpu(), c.conj()), "conj().cpu()"
assert torch.equal(f.conj().resolve_conj().cpu(), c.conj()), "resolve_conj()"
x = torch.randn(5)
assert torch.equal(x.to("flagos")._neg_view().cpu(), -x), "_neg_view().cpu()"
if torch.flagos.device_count() > 1:
    assert torch.equal(f.conj().to("flagos:1").cpu(), c.conj()), "conj() across devices"
dst = torch.empty(3, 4, dtype=torch.complex64, device="flagos")
dst.copy_(c.conj())
assert torch.equal(dst.cpu(), c.conj()), "copy_ of a cpu conj view"
print("CONJ_OK")
"""


@pytest.fixture(scope="module")
def conj_neg_run(start_py):
    return start_py(CONJ_NEG_SNIPPET)


def test_copy_of_conj_and_neg_views(conj_neg_run):
    rc, out, err = conj_neg_run.result()
    assert rc == 0, f"child exited with {rc}: {err[-2000:]}"
    assert "CONJ_OK" in out


def test_complex_views_without_lazy_bits():
    c = torch.randn(3, 4, dtype=torch.complex64)
    f = c.to("flagos")
    assert torch.equal(torch.view_as_real(f).cpu(), torch.view_as_real(c))
    assert torch.equal(f.real.cpu(), c.real)
    assert torch.equal(f.conj_physical().cpu(), c.conj())
    assert same_memory(torch.view_as_real(f), f)


def test_channels_last_memory_format():
    src = torch.randn(2, 3, 4, 5)
    e = torch.empty(2, 3, 4, 5, device="flagos", memory_format=torch.channels_last)
    assert e.stride() == src.contiguous(memory_format=torch.channels_last).stride()
    f = src.to("flagos", memory_format=torch.channels_last)
    assert f.is_contiguous(memory_format=torch.channels_last)
    assert_same(f, src)
    assert_same(f.contiguous(), src)


# An operator of the native devices alone whose kernel returns two views of one
# tensor it made: on flagos it reaches the native kernel through the boxed
# route, and its results share one fresh storage (held by both, so by no
# result alone).
_halves_lib = torch.library.Library("flagos_test_tensors", "DEF")
_halves_lib.define("halves(Tensor x) -> (Tensor, Tensor)")


def _halves_cpu(x):
    y = x * 2
    n = x.shape[0] // 2
    return y[:n], y[n:]


_halves_lib.impl("halves", _halves_cpu, "CPU")
_halves_lib.impl("halves", _halves_cpu, "CUDA")


def test_results_sharing_a_fresh_storage_share_one_flagos_storage():
    x = torch.randn(10, generator=torch.Generator().manual_seed(3))
    a, b = torch.ops.flagos_test_tensors.halves(x.to("flagos"))
    ra, rb = _halves_cpu(x)
    assert_same(a, ra)
    assert_same(b, rb)
    assert a.device == DEV and b.device == DEV
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    a.fill_(7)  # one storage: b sees nothing of a's elements, and keeps its values
    assert_same(b, rb)
    assert torch.equal(a.cpu(), torch.full((5,), 7.0))


def test_transformer_encoder_padding_mask_in_eval():
    # In eval mode under no_grad, with a padding mask, nn.TransformerEncoder
    # takes PyTorch's fast path over nested tensors (_nested_tensor_from_mask,
    # then _transformer_encoder_layer_fwd on them): on flagos the native
    # device's nested kernels run it, so flagos gives the native device's bits.
    import torch_fl

    native = "cuda" if torch_fl.driver() == "cuda" else "cpu"
    torch.manual_seed(0)
    x = torch.randn(3, 5, 8)
    mask = torch.tensor([[False, False, False, True, True], [False, False, False, False, True],
                         [False, True, True, True, True]])
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    for nested in (True, False):
        encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()
        with torch.no_grad():
            want = encoder.to(native)(x.to(native), src_key_padding_mask=mask.to(native)).cpu()
            got = encoder.to("flagos")(x.to("flagos"), src_key_padding_mask=mask.to("flagos"))
        assert got.device == DEV
        assert_same(got, want, rtol=0, atol=0)


# --- DLPack ------------------------------------------------------------------------------


def test_dlpack_round_trips_and_shares_memory():
    from torch.utils.dlpack import DLDeviceType

    last = torch.flagos.device_count() - 1  # 1 with two devices
    t = torch.randn(3, 5, device=f"flagos:{last}")[:, 1:4]
    # What the capsule says: PyTorch's DLPack device of PrivateUse1.
    assert t.__dlpack_device__() == (DLDeviceType.kDLExtDev, last)
    for back in (torch.from_dlpack(t), torch.utils.dlpack.from_dlpack(t.__dlpack__())):
        assert back.device == t.device and back.stride() == t.stride()
        assert back.data_ptr() == t.data_ptr()
        assert torch.equal(back.cpu(), t.cpu())
    # Other devices keep PyTorch's answer.
    assert torch.randn(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse invariant checks are off by default
def test_sparse_coo_tensors_match_the_cpu():
    # Sparse COO flagos tensors run the native device's sparse kernels: made by
    # the factory, by .to("flagos") and by to_sparse(), their operators give
    # the CPU's results (bit-equal on the host driver, float32 rounding on the
    # cuda driver), and results stay sparse flagos tensors.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    indices = torch.tensor([[0, 3, 1, 3, 2], [4, 0, 2, 0, 1]])
    values = torch.randn(5)
    dense = torch.randn(5, 3)
    mostly_zero = torch.randn(4, 5).relu()

    def run(device):
        a = torch.sparse_coo_tensor(indices.to(device), values.to(device), (4, 5))
        b = torch.sparse_coo_tensor(indices, values * 3, (4, 5)).to(device)
        c = mostly_zero.to(device).to_sparse()
        d = a.coalesce()
        results = [a.to_dense(), (a + b).to_dense(), (d * 2).to_dense(), d.t().to_dense(),
                   torch.sparse.mm(d, dense.to(device)), d._indices(), d._values(),
                   (c + d).to_dense(), torch.sparse.sum(d, 1).to_dense(),
                   d.index_select(1, torch.tensor([0, 2], device=device)).to_dense()]
        assert a.is_sparse and a.device.type == device and not a.is_coalesced() and d.is_coalesced()
        assert a._nnz() == 5 and d._nnz() == 4 and (a + b).is_sparse
        back = d.cpu()
        assert back.is_sparse and back.device.type == "cpu"
        return results, back.to_dense()

    (got, got_back), (want, want_back) = run("flagos"), run("cpu")
    for g, w in zip(got, want):
        assert g.device == DEV
        assert_same(g, w, rtol=tol, atol=tol)
    assert_same(got_back, want_back, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse compressed tensors are beta
def test_sparse_in_place_operators_match_the_cpu():
    # A sparse kernel gives its in-place output new indices, values, sizes and
    # flags: the flagos tensor takes them over, and the call returns it.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    # Sorted and unique (coalesced, though not flagged): _coalesced_(True) below tells the truth.
    indices = torch.tensor([[0, 0, 1, 1], [1, 2, 0, 2]])
    values = torch.randn(4)
    dense = torch.randn(3, 4)
    dense[dense.abs() < 0.5] = 0
    coo_cases = {
        "copy_": lambda a, b: a.copy_(b),
        "add_": lambda a, b: a.add_(b, alpha=2),
        "mul_": lambda a, b: a.mul_(3),
        "div_": lambda a, b: a.div_(2),
        "zero_": lambda a, b: a.zero_(),
        "resize_as_": lambda a, b: a.resize_as_(b.coalesce()),
        "sparse_resize_and_clear_": lambda a, b: a.sparse_resize_and_clear_((3, 4), 2, 0),
        "_coalesced_": lambda a, b: a._coalesced_(True),
        "out=": lambda a, b: torch.add(b, b, out=a),
    }
    csr_cases = {
        "copy_": lambda a: a.copy_(a * 2),
        "mul_": lambda a: a.mul_(3),
        "add_": lambda a: a.add_(a),
        "zero_": lambda a: a.zero_(),
        "resize_as_": lambda a: a.resize_as_(torch.eye(5).to_sparse_csr().to(a.device)),
    }

    def run(device):
        results = []
        for fn in coo_cases.values():
            # values cloned: a CPU sparse tensor shares them, and in-place kernels write them
            a = torch.sparse_coo_tensor(indices, values.clone(), (2, 3)).to(device)
            b = torch.sparse_coo_tensor(indices[:, :2], values[:2] * 5, (2, 3)).to(device)
            assert fn(a, b) is a
            results.append((a.to_dense(), a._indices(), a._values(), a.is_coalesced()))
        for fn in csr_cases.values():
            a = dense.to(device).to_sparse_csr()
            assert fn(a) is a
            results.append((a.to_dense(), a.crow_indices(), a.col_indices(), a.values()))
        return results

    got, want = run("flagos"), run("cpu")
    for name, g, w in zip([*coo_cases, *(f"csr {n}" for n in csr_cases)], got, want):
        # The structure (indices, coalesced flag) is the kernel's: the CPU's on
        # the host driver; CUDA's sparse kernels may keep duplicates the CPU merges.
        for gt, wt in zip(g, w) if tol == 0.0 else [(g[0], w[0])]:
            if isinstance(wt, bool):
                assert gt == wt, name
            else:
                assert gt.device == DEV, name
                assert_same(gt, wt, rtol=tol, atol=tol)


def test_sparse_gradients_accumulate_as_on_the_cpu():
    # Two backward passes without zero_grad: autograd adds the second sparse
    # gradient into the first in place.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    weight = torch.randn(10, 4)
    batches = [torch.randint(0, 10, (3, 5)) for _ in range(3)]

    def run(device):
        emb = torch.nn.Embedding(10, 4, sparse=True).to(device)
        with torch.no_grad():
            emb.weight.copy_(weight)
        for idx in batches:
            emb(idx.to(device)).square().sum().backward()
        return emb.weight.grad

    got, want = run("flagos"), run("cpu")
    assert got.is_sparse and got.device == DEV
    assert_same(got.to_dense(), want.to_dense(), rtol=tol, atol=tol)


@pytest.mark.parametrize("bag", [False, True])
def test_sparse_gradients_train_as_on_the_cpu(bag):
    # nn.Embedding(sparse=True) and nn.EmbeddingBag(sparse=True) give sparse
    # gradients, which SparseAdam (and SGD) consume.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    make = (lambda: torch.nn.EmbeddingBag(20, 4, sparse=True)) if bag else (
        lambda: torch.nn.Embedding(20, 4, sparse=True))
    cpu = make()
    flagos = make().to("flagos")
    flagos.load_state_dict(cpu.state_dict())
    optimizers = [torch.optim.SparseAdam(cpu.parameters(), lr=0.1),
                  torch.optim.SparseAdam(flagos.parameters(), lr=0.1)]
    for _ in range(3):
        idx = torch.randint(0, 20, (3, 5))
        for model, opt in zip((cpu, flagos), optimizers):
            opt.zero_grad()
            device = next(model.parameters()).device
            model(idx.to(device)).square().sum().backward()
            assert model.weight.grad.is_sparse and model.weight.grad.device == device
            opt.step()
    assert_same(flagos.weight.detach(), cpu.weight.detach(), rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse compressed tensors are beta
@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc"])
def test_sparse_compressed_tensors_match_the_cpu(layout):
    # Sparse compressed flagos tensors run the native device's kernels for the
    # layout: made by .to("flagos"), by the factory and by a conversion of a
    # dense flagos tensor, their operators give the CPU's results (bit-equal on
    # the host driver, float32 rounding on the cuda driver), results keep the
    # layout on flagos, and .cpu() brings them back.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    dense = torch.randn(4, 6)
    dense[dense.abs() < 0.6] = 0
    other = torch.randn(6, 3)
    convert = {"csr": lambda t: t.to_sparse_csr(), "csc": lambda t: t.to_sparse_csc(),
               "bsr": lambda t: t.to_sparse_bsr((2, 3)), "bsc": lambda t: t.to_sparse_bsc((2, 3))}
    compressed, plain = (("crow_indices", "col_indices") if layout in ("csr", "bsr")
                         else ("ccol_indices", "row_indices"))

    def run(device):
        cpu = convert[layout](dense)
        moved, made = cpu.to(device), convert[layout](dense.to(device))
        factory = torch.sparse_compressed_tensor(
            getattr(cpu, compressed)(), getattr(cpu, plain)(), cpu.values() * 2, cpu.shape,
            layout=cpu.layout, device=device)
        for t in (moved, made, factory):
            assert (t.layout, t.device.type) == (cpu.layout, device)
            assert t._nnz() == cpu._nnz() and t.values().device.type == device
        scaled = made * 3
        assert scaled.layout == cpu.layout and scaled.device.type == device
        results = [moved.to_dense(), made.to_dense(), factory.to_dense(), scaled.to_dense(),
                   made.values(), getattr(made, compressed)(), getattr(made, plain)(),
                   made.to_sparse().to_dense(), made.t().to_dense()]
        if layout == "csr":  # the layout CPU and CUDA multiply with
            v = made.values().detach().clone().requires_grad_()
            weights = torch.sparse_csr_tensor(made.crow_indices(), made.col_indices(), v,
                                              made.shape)
            product = torch.sparse.mm(weights, other.to(device))
            (grad,) = torch.autograd.grad(product.square().sum(), v)
            results += [product, made @ other.to(device), (made + made).to_dense(), grad,
                        made.sin().to_dense(), made.sum()]
        back = made.cpu()
        assert back.layout == cpu.layout and back.device.type == "cpu"
        return results, back.to_dense()

    (got, got_back), (want, want_back) = run("flagos"), run("cpu")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == DEV
        assert_same(g, w, rtol=tol, atol=tol)
    assert_same(got_back, want_back, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
@pytest.mark.parametrize("make", ["nested_tensor", "as_nested_tensor", "cpu_to"])
def test_nested_tensor_on_flagos_comes_back(make):
    # PyTorch makes these on flagos without asking it: its data must not be
    # trapped there.
    parts = [torch.randn(3, 4), torch.randn(5, 4)]
    t = {"nested_tensor": lambda: torch.nested.nested_tensor(parts, device="flagos"),
         "as_nested_tensor": lambda: torch.nested.as_nested_tensor([p.to("flagos") for p in parts]),
         "cpu_to": lambda: torch.nested.nested_tensor(parts).to("flagos")}[make]()
    assert t.is_nested and t.device == DEV
    padded = torch.nested.nested_tensor(parts).to_padded_tensor(-1.0)
    back = t.cpu()
    assert back.is_nested and back.device.type == "cpu"
    assert torch.equal(back.to_padded_tensor(-1.0), padded)
    assert torch.equal(t.to_padded_tensor(-1.0).cpu(), padded)
    assert all(u.device == DEV and torch.equal(u.cpu(), p) for u, p in zip(t.unbind(), parts))
    doubled = t.to(torch.float64)
    assert doubled.is_nested and doubled.dtype == torch.float64 and doubled.device == DEV
    assert "nested_tensor(" in repr(t)


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
def test_nested_tensor_operators_and_autograd_match_the_cpu():
    # The native device's nested kernels run on flagos' nested tensors: forward
    # and backward equal the CPU's (bit-equal on the host driver, float32
    # rounding on the cuda driver: a CUDA backward cannot run beside flagos'
    # autograd, docs/gpu.md), results stay nested flagos tensors, and an
    # in-place operator writes the tensor's own memory.
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    weight = torch.randn(5, 3)

    def run(device):
        a = torch.nested.nested_tensor([p.to(device) for p in parts], requires_grad=True)
        w = weight.to(device).requires_grad_()
        y = torch.nn.functional.softmax(torch.nn.functional.linear(a, w) * 2 + 1, -1)
        assert y.is_nested and y.device.type == device
        y.to_padded_tensor(0.0).square().sum().backward()  # _nested_from_padded takes CPU sizes
        b = torch.nested.nested_tensor([p.to(device) for p in parts])
        storage = b.values().untyped_storage().data_ptr()
        b.mul_(3)
        assert b.values().untyped_storage().data_ptr() == storage
        return [y.to_padded_tensor(0.0), a.grad.to_padded_tensor(0.0), w.grad,
                b.to_padded_tensor(0.0), b.transpose(1, 2).contiguous().to_padded_tensor(0.0)]

    for got, want in zip(run("flagos"), run("cpu")):
        assert got.device == DEV
        assert_same(got, want, rtol=tol, atol=tol)
    stats = {s.op: s.calls for s in torch_fl.routing.stats()}
    assert stats["aten::linear"].get("native", 0) >= 1


@pytest.mark.parametrize("shape", [(3, 1), (), (2, 3)])
def test_addr_in_place_refuses_a_self_of_the_wrong_shape(shape):
    # addr_ calls addr's out= form with self twice; the native kernel checks
    # self's shape only when it sees one argument, by its address.
    v1, v2 = torch.randn(3), torch.randn(2)
    cpu = torch.randn(shape)
    flagos = cpu.to("flagos")
    with pytest.raises(RuntimeError) as want:
        cpu.clone().addr_(v1, v2)
    with pytest.raises(RuntimeError) as got:
        flagos.addr_(v1.to("flagos"), v2.to("flagos"))
    assert str(got.value).splitlines()[0] == str(want.value).splitlines()[0]
    assert flagos.shape == shape and torch.equal(flagos.cpu(), cpu)  # untouched


def test_addr_in_place_matches_the_cpu():
    v1, v2, cpu = torch.randn(3), torch.randn(2), torch.randn(3, 2)
    flagos = cpu.to("flagos")
    assert flagos.addr_(v1.to("flagos"), v2.to("flagos"), beta=0.5, alpha=2) is flagos
    import torch_fl

    tol = 1e-6 if torch_fl.driver() == "cuda" else 0.0
    assert_same(flagos, cpu.addr_(v1, v2, beta=0.5, alpha=2), rtol=tol, atol=tol)


def test_set_to_a_storage_of_another_device_is_refused_in_the_cpus_words():
    t, cpu = torch.empty(0, device="flagos"), torch.randn(4)
    words = r'Attempted to set the storage of a tensor on device "flagos:0" to a storage on different device "cpu"'
    with pytest.raises(RuntimeError, match=words):
        t.set_(cpu.untyped_storage())
    with pytest.raises(RuntimeError, match=words):
        t.set_(cpu)
    with pytest.raises(RuntimeError, match=words):
        t.set_(cpu.untyped_storage(), 0, (2,), (1,))


@pytest.mark.parametrize("periodic", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kaiser_window_matches_the_cpu(periodic, dtype):
    # Its composite kernel calls a DispatchStub by device type, which has no
    # flagos entry: it is routed whole, on the native device.
    import torch_fl

    tol = 0.0 if torch_fl.driver() == "host" else 1e-6  # the CPU's kernel, or CUDA's
    for n in (0, 1, 7, 64):
        want = torch.kaiser_window(n, periodic, 12.0, dtype=dtype)
        got = torch.kaiser_window(n, periodic, 12.0, dtype=dtype, device="flagos")
        assert got.device == DEV
        assert_same(got, want, rtol=tol, atol=tol)
    assert_same(torch.kaiser_window(16, device="flagos"), torch.kaiser_window(16), rtol=tol, atol=tol)


@pytest.mark.parametrize("fn", ["lu_solve", "solve", "solve_ex"])
@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_an_out_tensor_whose_conj_bit_the_kernel_sets_keeps_it(fn, dtype):
    # With left=False, linalg's solvers write the conjugate of the result into
    # `out` and set its conj bit: the bit must reach the flagos tensor.
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=dtype) + 3 * torch.eye(3, dtype=dtype)
    b = torch.randn(2, 3, dtype=dtype)
    if fn == "lu_solve":
        lu, piv = torch.linalg.lu_factor(a)
        call = lambda d, out: torch.linalg.lu_solve(lu.to(d), piv.to(d), b.to(d), left=False, out=out)
    elif fn == "solve":
        call = lambda d, out: torch.linalg.solve(a.to(d), b.to(d), left=False, out=out)
    else:
        call = lambda d, out: torch.linalg.solve_ex(a.to(d), b.to(d), left=False, out=(out, torch.empty(0, dtype=torch.int32, device=d)))
    want = torch.empty(0, dtype=dtype)
    call("cpu", want)
    got = torch.empty(0, dtype=dtype, device="flagos")
    call("flagos", got)
    assert got.is_conj() == want.is_conj() and got.stride() == want.stride()
    import torch_fl

    tol = 0.0 if torch_fl.driver() == "host" else 1e-5
    assert_same(got.resolve_conj(), want.resolve_conj(), rtol=tol, atol=tol)


def test_conj_physical_in_place_and_complex_svd_out_match_the_cpu():
    # conj_physical_'s composite calls a DispatchStub by device type.
    torch.manual_seed(0)
    z = torch.randn(5, dtype=torch.complex64)
    got = z.to("flagos")
    assert got.conj_physical_() is got
    assert_same(got, z.clone().conj_physical_())
    a = torch.randn(4, 3, dtype=torch.complex64)
    outs = tuple(torch.empty(0, dtype=t, device="flagos") for t in (a.dtype, torch.float32, a.dtype))
    torch.svd(a.to("flagos"), out=outs)
    import torch_fl

    native = "cuda" if torch_fl.driver() == "cuda" else "cpu"  # singular vectors: the native kernel's
    for g, w in zip(outs, torch.svd(a.to(native))):
        assert_same(g.resolve_conj(), w.resolve_conj().cpu())


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse compressed tensors are beta
@pytest.mark.parametrize("layout", ["sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr",
                                    "sparse_bsc"])
def test_opinfo_sparse_samples_match_the_cpu(layout):
    # PyTorch's own sparse samples (OpInfo.sample_inputs_sparse) of every op
    # that declares the layout: results of the same layout and values as the
    # CPU's, errors where the CPU raises.
    import unittest

    import opinfo_sweep
    import torch_fl
    from torch.utils._pytree import tree_map

    opinfo_sweep.ensure_expecttest()  # op_db imports it; the GPU machines lack it
    from torch.testing._internal.common_methods_invocations import op_db

    torch.manual_seed(0)  # the samples' values (masks included) are drawn
    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    flag = "supports_sparse" if layout == "sparse_coo" else f"supports_{layout}"
    layout = getattr(torch, layout)

    def to(x, device):
        return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, x)

    def compare(got, want, where, device, values=True):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor), where
            assert (got.layout, got.dtype, got.shape) == (want.layout, want.dtype, want.shape), where
            assert got.device.type == device, where
            if not values:
                return
            if got.layout == torch.sparse_coo:  # its structure, before to_dense() reads it
                assert (got.sparse_dim(), got.dense_dim(), got._indices().shape[0]) == (
                    want.sparse_dim(), want.dense_dim(), want._indices().shape[0]), where
            dense = lambda t: t.cpu().to_dense() if t.layout != torch.strided else t.cpu()
            try:
                expected = dense(want)
            except RuntimeError as e:
                # The CPU's own result is malformed (masked.mean of some CSR
                # masks: fewer column indices than values): so is flagos'.
                with pytest.raises(type(e)):
                    dense(got)
                return
            torch.testing.assert_close(dense(got), expected, rtol=tol, atol=tol, equal_nan=True,
                                       msg=lambda m: f"{where}: {m}")
        elif isinstance(want, (list, tuple)):
            assert len(got) == len(want), where
            for g, w in zip(got, want):
                compare(g, w, where, device, values)
        else:
            assert got == want, where

    compared = 0
    for op in op_db:
        if not getattr(op, flag, False):
            continue
        for dtype in (torch.float32, torch.float64):
            if dtype not in op.supported_dtypes("cpu"):
                continue
            try:
                samples = list(op.sample_inputs_sparse(layout, "cpu", dtype))[:4]
            except (NotImplementedError, unittest.SkipTest):  # declared, but no samples
                continue
            for i, s in enumerate(samples):
                where = f"{op.name} {dtype} sample {i}"
                try:
                    want = op(s.input, *s.args, **s.kwargs)
                except Exception as e:  # the CPU refuses: flagos must refuse too
                    with pytest.raises(type(e)):
                        op(to(s.input, "flagos"), *to(s.args, "flagos"), **to(s.kwargs, "flagos"))
                    continue
                got = op(to(s.input, "flagos"), *to(s.args, "flagos"), **to(s.kwargs, "flagos"))
                # flagos, unless the sample names a device (zeros_like(device="cpu"));
                # randn_like draws from another generator: its values differ
                compare(got, want, where, want.device.type if "device" in s.kwargs else "flagos",
                        values=op.name != "randn_like")
                compared += 1
    assert compared > 0, f"no OpInfo declares {layout}"


@pytest.mark.filterwarnings("ignore::UserWarning")  # sparse compressed tensors are beta
@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("direction", ["cpu->flagos", "flagos->cpu", "flagos:0->flagos:1"])
def test_sparse_copy_across_devices(layout, direction):
    # PyTorch's sparse copy_ moves the components itself (DDP copies a
    # reduced sparse gradient into the parameter's): no twin can take the
    # other device's tensor.
    torch.manual_seed(0)
    dense = torch.randn(4, 5)
    dense[dense.abs() < 0.7] = 0
    make = (lambda t: t.to_sparse()) if layout == "coo" else (lambda t: t.to_sparse_csr())
    source, target = {"cpu->flagos": ("cpu", "flagos:0"), "flagos->cpu": ("flagos:0", "cpu"),
                      "flagos:0->flagos:1": ("flagos:0", "flagos:1")}[direction]
    src = make(dense).to(source)
    # copy_ of compressed tensors keeps the destination's structure: same nnz
    dst = make(dense * 0 if layout == "coo" else dense * 2).to(target)
    assert dst.copy_(src) is dst
    assert dst.device == torch.device(target) and dst.layout == src.layout
    assert torch.equal(dst.to_dense().cpu(), dense)


def test_sparse_tensor_given_twice_is_one_tensor_to_the_kernel():
    # smm passes its output as its input too: the kernel resizes one and reads the other.
    indices, values = torch.tensor([[0, 1, 3], [1, 2, 4]]), torch.tensor([1.0, 2.0, 3.0])
    dense = torch.randn(5, 3)
    want = torch.smm(torch.sparse_coo_tensor(indices, values.clone(), (4, 5)), dense)
    sparse = torch.sparse_coo_tensor(indices, values, (4, 5))
    import torch_fl

    if torch_fl.driver() == "cuda":
        # CUDA has no sspaddmm kernel: flagos raises CUDA's own error.
        with pytest.raises(RuntimeError) as native:
            torch.smm(sparse.cuda(), dense.cuda())
        with pytest.raises(RuntimeError, match="sspaddmm") as routed:
            torch.smm(sparse.to("flagos"), dense.to("flagos"))
        assert str(routed.value).splitlines()[0] == str(native.value).splitlines()[0]
        return
    got = torch.smm(sparse.to("flagos"), dense.to("flagos"))
    assert got.is_sparse and got.device == DEV
    assert torch.equal(got.to_dense().cpu(), want.to_dense())


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
def test_nested_multi_head_self_attention_matches_the_cpu():
    # The fast path fuses the q/k/v projections when query, key and value are
    # one tensor, which it tells by identity: one twin for the three.
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval()
    x = torch.nested.nested_tensor([torch.randn(3, 8), torch.randn(5, 8)])
    with torch.no_grad():
        want = mha(x, x, x, need_weights=False)[0].to_padded_tensor(0.0)
        mha.to("flagos")
        xf = x.to("flagos")
        got = mha(xf, xf, xf, need_weights=False)[0].to_padded_tensor(0.0)
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    assert_same(got, want, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_nested_scaled_dot_product_attention_matches_the_cpu(dropout):
    # Strided nested inputs (per sample: heads x sequence x head dim, the
    # sequences ragged, key and value longer than the query) take the choice
    # the native device makes for their twins: the math path on the CPU.
    # Forward and backward equal the CPU's; with dropout, so do the masks
    # (flagos draws them from its own generator, seeded alike).
    import torch_fl

    tol = 1e-5 if torch_fl.driver() == "cuda" else 0.0
    torch.manual_seed(0)
    lengths = [(3, 5), (6, 2), (1, 4)]
    qs = [torch.randn(2, lq, 8) for lq, _ in lengths]
    ks = [torch.randn(2, lk, 8) for _, lk in lengths]
    vs = [torch.randn(2, lk, 8) for _, lk in lengths]

    def run(device):
        q, k, v = (torch.nested.nested_tensor([p.to(device) for p in ps], requires_grad=True)
                   for ps in (qs, ks, vs))
        torch.manual_seed(1)
        if device == "flagos":
            torch.flagos.manual_seed(1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout,
                                                               scale=0.3)
        assert out.is_nested and out.device.type == device
        # The output is a transposed view, which to_padded_tensor refuses.
        out.contiguous().to_padded_tensor(0.0).square().sum().backward()
        return [t.contiguous().to_padded_tensor(0.0) for t in (out, q.grad, k.grad, v.grad)]

    want = run("cpu")
    got = run("flagos")
    if dropout and torch_fl.driver() == "cuda":
        return  # CUDA's generator draws other masks than the CPU's
    for g, w in zip(got, want):
        assert g.device == DEV
        assert_same(g, w, rtol=tol, atol=tol)


@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
def test_nested_views_of_a_buffer_and_their_serialization():
    # as_nested_tensor of a dense tensor, and torch.load's rebuilding of a
    # nested tensor, view a flagos buffer as nested (_nested_view_from_buffer).
    import io

    dense = torch.randn(2, 3, 4)
    got = torch.nested.as_nested_tensor(dense.to("flagos"))
    assert got.is_nested and got.device == DEV
    assert torch.equal(got.to_padded_tensor(0.0).cpu(), dense)
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    buffer = io.BytesIO()
    torch.save(torch.nested.nested_tensor(parts, device="flagos"), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.is_nested and loaded.device == DEV
    for g, w in zip(loaded.unbind(), parts):
        assert torch.equal(g.cpu(), w)
