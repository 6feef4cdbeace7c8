"""Random number generation on flagos: seeding, state, per-device and explicit generators."""

import pytest
import torch
import torch.nn.functional as F

import torch_fl


@pytest.fixture(autouse=True)
def restore_rng_and_device():
    states = torch.flagos.get_rng_state_all()
    device = torch.flagos.current_device()
    yield
    torch.flagos.set_device(device)
    torch.flagos.set_rng_state_all(states)


def draw(device="flagos", n=64):
    return torch.randn(n, device=device).cpu()


def test_torch_manual_seed_makes_draws_reproducible():
    torch.manual_seed(1234)
    a = draw()
    b = torch.rand(10, device="flagos").cpu()
    torch.manual_seed(1234)
    assert torch.equal(draw(), a)
    assert torch.equal(torch.rand(10, device="flagos").cpu(), b)


def test_torch_manual_seed_seeds_every_flagos_device():
    torch.manual_seed(99)
    a0, a1 = draw("flagos:0"), draw("flagos:1")
    torch.manual_seed(99)
    assert torch.equal(draw("flagos:1"), a1)
    assert torch.equal(draw("flagos:0"), a0)


def test_flagos_manual_seed_makes_draws_reproducible():
    devices = [f"flagos:{i}" for i in range(torch.flagos.device_count())]
    torch.flagos.manual_seed(7)
    a = draw()
    torch.flagos.manual_seed(7)
    assert torch.equal(draw(), a)
    torch.flagos.manual_seed_all(11)
    b = [draw(d) for d in devices]
    torch.flagos.manual_seed_all(11)
    for d, ref in zip(devices, b):
        assert torch.equal(draw(d), ref), d


def test_flagos_manual_seed_only_seeds_current_device():
    torch.flagos.manual_seed_all(5)
    first1 = draw("flagos:1")
    torch.flagos.manual_seed_all(5)
    torch.flagos.manual_seed(6)  # current device (0) only
    assert torch.equal(draw("flagos:1"), first1)


def test_different_seeds_give_different_draws():
    torch.manual_seed(1)
    a = draw()
    torch.manual_seed(2)
    b = draw()
    assert not torch.equal(a, b)


def test_consecutive_draws_differ():
    torch.manual_seed(3)
    assert not torch.equal(draw(), draw())


def test_rng_state_round_trip_reproduces_draws():
    torch.manual_seed(42)
    draw()  # advance somewhere non-trivial
    state = torch.flagos.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = draw()
    u = torch.empty(32, device="flagos").uniform_().cpu()
    torch.flagos.set_rng_state(state)
    assert torch.equal(draw(), a)
    assert torch.equal(torch.empty(32, device="flagos").uniform_().cpu(), u)


def test_get_rng_state_returns_a_snapshot():
    state = torch.flagos.get_rng_state()
    copy = state.clone()
    draw()
    assert torch.equal(state, copy)


def test_rng_state_of_device_1_round_trips():
    state1 = torch.flagos.get_rng_state("flagos:1")
    a = draw("flagos:1")
    torch.flagos.set_rng_state(state1, "flagos:1")
    assert torch.equal(draw("flagos:1"), a)


def test_rng_state_all_round_trip():
    devices = [f"flagos:{i}" for i in range(torch.flagos.device_count())]
    states = torch.flagos.get_rng_state_all()
    assert len(states) == len(devices)
    a = [draw(d) for d in devices]
    torch.flagos.set_rng_state_all(states)
    for d, ref in zip(devices, a):
        assert torch.equal(draw(d), ref), d


def test_per_device_generators_are_independent():
    torch.flagos.manual_seed_all(21)
    ref1 = draw("flagos:1")
    torch.flagos.manual_seed_all(21)
    for _ in range(3):
        draw("flagos:0")  # advancing device 0 ...
    assert torch.equal(draw("flagos:1"), ref1)  # ... leaves device 1 alone
    g0, g1 = torch.flagos.default_generators
    assert g0.device == torch.device("flagos", 0)
    assert g1.device == torch.device("flagos", 1)


def test_flagos_rng_independent_of_cpu_rng():
    torch.manual_seed(8)
    ref = draw()
    torch.manual_seed(8)
    torch.randn(1000)  # CPU draws must not advance the flagos generator
    assert torch.equal(draw(), ref)


def test_fork_rng_restores_flagos_state():
    torch.manual_seed(17)
    with torch.random.fork_rng(devices=range(torch.flagos.device_count()), device_type="flagos"):
        draw()
        draw()
    after = draw()
    torch.manual_seed(17)
    assert torch.equal(draw(), after)


def test_explicit_generator_with_randn_and_normal():
    g = torch.Generator(device="flagos")
    assert g.device == torch.device("flagos", 0)
    g.manual_seed(2024)
    a = torch.randn(50, device="flagos", generator=g).cpu()
    b = torch.empty(50, device="flagos").normal_(3.0, 0.5, generator=g).cpu()
    g.manual_seed(2024)
    assert torch.equal(torch.randn(50, device="flagos", generator=g).cpu(), a)
    assert torch.equal(torch.empty(50, device="flagos").normal_(3.0, 0.5, generator=g).cpu(), b)
    assert abs(b.mean().item() - 3.0) < 0.5


def test_explicit_generator_does_not_touch_default_generator():
    torch.manual_seed(5)
    ref = draw()
    torch.manual_seed(5)
    g = torch.Generator(device="flagos").manual_seed(1)
    torch.randn(100, device="flagos", generator=g)
    assert torch.equal(draw(), ref)


def test_explicit_generator_for_device_1():
    g = torch.Generator(device="flagos:1").manual_seed(3)
    t = torch.rand(10, device="flagos:1", generator=g)
    assert t.device == torch.device("flagos", 1)
    g.manual_seed(3)
    assert torch.equal(torch.rand(10, device="flagos:1", generator=g).cpu(), t.cpu())


def test_generator_state_round_trip():
    g = torch.Generator(device="flagos").manual_seed(77)
    torch.randn(5, device="flagos", generator=g)
    s = g.get_state()
    a = torch.randn(8, device="flagos", generator=g).cpu()
    g.set_state(s)
    assert torch.equal(torch.randn(8, device="flagos", generator=g).cpu(), a)
    clone = torch.Generator(device="flagos")
    clone.set_state(s)
    assert torch.equal(torch.randn(8, device="flagos", generator=clone).cpu(), a)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_generator_copies_continue_its_stream(how):
    import copy
    import pickle

    g = torch.Generator(device="flagos").manual_seed(91)
    torch.randn(5, device="flagos", generator=g)
    c = copy.deepcopy(g) if how == "deepcopy" else pickle.loads(pickle.dumps(g))
    assert c.device == g.device and c.initial_seed() == 91
    a = torch.randn(8, device="flagos", generator=g).cpu()
    assert torch.equal(torch.randn(8, device="flagos", generator=c).cpu(), a)
    d = copy.deepcopy(torch.flagos.default_generators[0])
    assert d.device == torch.device("flagos", 0)


def test_generator_offset_where_the_native_generator_has_one():
    g = torch.Generator(device="flagos").manual_seed(5)
    if torch_fl.driver() == "cuda":  # CUDA's Philox generator: an offset
        g.set_offset(16)
        assert g.get_offset() == 16
        return
    for call in (lambda: g.get_offset(), lambda: g.set_offset(16)):
        with pytest.raises(RuntimeError, match=r"does not support [gs]et_offset on the host driver"
                           r".*CPU's generator .*get_state\(\) and set_state\(\)"):
            call()


def test_generator_drives_bernoulli_dropout_mask():
    g = torch.Generator(device="flagos")
    g.manual_seed(10)
    m1 = torch.empty(200, device="flagos").bernoulli_(0.5, generator=g).cpu()
    g.manual_seed(10)
    m2 = torch.empty(200, device="flagos").bernoulli_(0.5, generator=g).cpu()
    assert torch.equal(m1, m2)
    assert 40 < m1.sum().item() < 160
    g.manual_seed(11)
    assert not torch.equal(torch.empty(200, device="flagos").bernoulli_(0.5, generator=g).cpu(), m1)


def _dropout_is_well_formed(x, d, p):
    kept = d != 0
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(d[kept], x.cpu()[kept] / (1 - p), rtol=1e-6, atol=1e-6)


def test_dropout_is_reproducible_under_torch_manual_seed():
    x = torch.randn(200, device="flagos") + 5.0  # no zeros in the input
    torch.manual_seed(10)
    d1 = F.dropout(x, p=0.3, training=True).cpu()
    torch.manual_seed(10)
    d2 = F.dropout(x, p=0.3, training=True).cpu()
    assert torch.equal(d1, d2)
    _dropout_is_well_formed(x, d1, 0.3)


def test_dropout_follows_the_flagos_generator():
    x = torch.randn(200, device="flagos") + 5.0
    torch.flagos.manual_seed(10)
    d1 = F.dropout(x, p=0.3, training=True).cpu()
    torch.randn(10)  # unrelated CPU draws in between must not matter
    torch.flagos.manual_seed(10)
    d2 = F.dropout(x, p=0.3, training=True).cpu()
    _dropout_is_well_formed(x, d1, 0.3)
    assert torch.equal(d1, d2)
    # and dropout on flagos advances the flagos generator, not the CPU one
    flagos_state, cpu_state = torch.flagos.get_rng_state(), torch.get_rng_state()
    torch.nn.Dropout(0.5)(x)
    assert torch.equal(torch.get_rng_state(), cpu_state)
    assert not torch.equal(torch.flagos.get_rng_state(), flagos_state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("train", [True, False, None])
def test_native_dropout_matches_the_native_kernel(dtype, train):
    # The mask is bool (the CPU, CUDA and meta kernels' contract: code that
    # indexes or negates it breaks otherwise), and the outputs are the native
    # kernel's, bit for bit, for the same seed: the CPU's on the host driver,
    # CUDA's (whose generator flagos shares) on the cuda driver.
    native = "cuda" if torch_fl.driver() == "cuda" else "cpu"
    x = torch.randn(6, 10, dtype=dtype).t()  # non-contiguous: the layout is the kernel's
    outs = {}
    if native == "cuda":
        torch_fl.routing.set_route("native_dropout", "cuda")  # not FlagGems' kernel
    try:
        for device in (native, "flagos"):
            torch.manual_seed(7)
            outs[device] = torch.native_dropout(x.to(device), 0.4, train)
    finally:
        if native == "cuda":
            torch_fl.routing.set_route("native_dropout", "")
    (out, mask), (ref_out, ref_mask) = outs["flagos"], outs[native]
    assert out.device.type == mask.device.type == "flagos"
    assert (out.dtype, mask.dtype) == (dtype, torch.bool)
    assert (out.stride(), mask.stride()) == (ref_out.stride(), ref_mask.stride())
    assert torch.equal(out.cpu(), ref_out.cpu()) and torch.equal(mask.cpu(), ref_mask.cpu())
    if train is not False:
        assert 0 < int(mask.sum()) < mask.numel()
        expected = torch.where(mask.cpu(), x.float() / 0.6, 0.0).to(dtype)
        torch.testing.assert_close(out.cpu(), expected, rtol=0.01, atol=0.0)


@pytest.mark.parametrize("train", [True, None])
def test_native_dropout_without_train_is_training(train):
    # None means training to the CPU and CUDA kernels, on every route (FlagGems'
    # kernel, the default on the cuda driver, reads None as eval: this guards
    # the cuda driver; the host driver's own kernel always trained).
    x = torch.randn(200, device="flagos") + 5.0  # no zeros in the input
    out, mask = torch.native_dropout(x, 0.4, train)
    assert mask.dtype == torch.bool and 0 < int(mask.sum()) < mask.numel()
    expected = torch.where(mask, x / 0.6, 0.0)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_generator_for_randperm_and_multinomial():
    g = torch.Generator(device="flagos").manual_seed(0)
    p = torch.randperm(20, device="flagos", generator=g).cpu()
    assert sorted(p.tolist()) == list(range(20))
    probs = torch.rand(5, device="flagos") + 0.1
    g.manual_seed(0)
    s1 = torch.multinomial(probs, 50, replacement=True, generator=g).cpu()
    g.manual_seed(0)
    s2 = torch.multinomial(probs, 50, replacement=True, generator=g).cpu()
    assert torch.equal(s1, s2)


def test_initial_seed_reports_manual_seed():
    torch.flagos.manual_seed(31337)
    assert torch.flagos.initial_seed() == 31337
    torch.manual_seed(4242)
    assert torch.flagos.initial_seed() == 4242
    torch.flagos.set_device(torch.flagos.device_count() - 1)  # flagos:1 with two devices
    assert torch.flagos.initial_seed() == 4242


def test_seed_picks_a_fresh_random_seed():
    torch.flagos.manual_seed(1)
    torch.flagos.seed()
    s1 = torch.flagos.initial_seed()
    torch.flagos.seed()
    s2 = torch.flagos.initial_seed()
    assert s1 != 1 or s2 != 1
    assert s1 != s2
    # draws follow the new seed
    a = draw()
    torch.flagos.manual_seed(s2)
    assert torch.equal(draw(), a)


def test_seed_all_seeds_every_device_alike():
    torch.flagos.seed_all()
    a0, a1 = draw("flagos:0"), draw("flagos:1")
    assert torch.equal(a0, a1)


# ---------------------------------------------------------------- bad input


def test_set_rng_state_with_float_tensor_raises_type_error():
    state = torch.flagos.get_rng_state()
    with pytest.raises(TypeError, match="uint8"):
        torch.flagos.set_rng_state(state.float())


def test_set_rng_state_with_wrong_size_raises_value_error():
    state = torch.flagos.get_rng_state()
    with pytest.raises(ValueError, match=rf"{state.numel() - 8}.*{state.numel()}"):
        torch.flagos.set_rng_state(state[:-8])
    with pytest.raises(ValueError, match="bytes"):
        torch.flagos.set_rng_state(torch.zeros(3, dtype=torch.uint8))


def test_set_rng_state_with_non_tensor_raises_type_error():
    with pytest.raises(TypeError, match="list"):
        torch.flagos.set_rng_state([1, 2, 3])
    with pytest.raises(TypeError):
        torch.flagos.set_rng_state(None)


def test_set_rng_state_with_flagos_tensor_raises_naming_cpu():
    state = torch.flagos.get_rng_state()
    with pytest.raises(RuntimeError, match="CPU"):
        torch.flagos.set_rng_state(state.to("flagos"))


def test_failed_set_rng_state_leaves_state_unchanged():
    state = torch.flagos.get_rng_state()
    for bad in (state.float(), state[:-1], [0]):
        with pytest.raises((TypeError, ValueError)):
            torch.flagos.set_rng_state(bad)
    assert torch.equal(torch.flagos.get_rng_state(), state)


def test_generator_set_state_with_bad_tensor_raises():
    g = torch.Generator(device="flagos")
    with pytest.raises(TypeError):
        g.set_state(torch.zeros(10))
    with pytest.raises(ValueError):
        g.set_state(torch.zeros(10, dtype=torch.uint8))


def test_a_generator_of_another_device_is_refused_in_atens_words():
    # The CPU's and CUDA's kernels say it so (check_generator); a DataLoader's
    # RandomSampler under set_default_device makes a CPU generator.
    with pytest.raises(RuntimeError, match="Expected a 'flagos' device type for generator but found 'cpu'"):
        torch.randn(3, device="flagos", generator=torch.Generator("cpu"))
    w = torch.empty(4, 4, device="flagos")
    with pytest.raises(RuntimeError, match="Expected a 'flagos' device type for generator but found 'cpu'"):
        torch.nn.init.normal_(w, generator=torch.Generator("cpu"))


def test_generator_on_out_of_range_device_raises():
    n = torch.flagos.device_count()
    with pytest.raises(RuntimeError, match=rf"{n + 3}.*0\.\.{n - 1}"):
        torch.Generator(device=f"flagos:{n + 3}")
