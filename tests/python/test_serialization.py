"""torch.save / torch.load of flagos tensors and module state."""

import io

import pytest
import torch
import torch.nn as nn

import torch_fl

DEV = torch.device("flagos", 0)
DEV1 = torch.device("flagos", 1)
# The last device: flagos:1 with two devices, flagos:0 with one. Tests where a
# non-default index is incidental use it, so that they run with one device too.
LAST = torch.device("flagos", torch.flagos.device_count() - 1)
# Computed results: the host driver runs the CPU's own kernels; the cuda
# driver runs CUDA's, which round differently from the CPU reference.
TOL = dict(rtol=1e-5, atol=1e-6) if torch_fl.driver() == "host" else dict(rtol=1e-4, atol=1e-5)


def save_to_bytes(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("device", ["flagos:0", "flagos:1"])
def test_load_without_map_location_restores_the_saved_device(device):
    ref = torch.randn(4, 7)
    t = ref.to(device)
    loaded = torch.load(save_to_bytes(t))
    assert loaded.device == torch.device(device)
    assert torch.equal(loaded.cpu(), ref)
    # a real copy, not the same memory
    assert loaded.data_ptr() != t.data_ptr()


def test_save_load_to_file(tmp_path):
    ref = torch.randn(3, 3, dtype=torch.float64)
    path = tmp_path / "t.pt"
    torch.save(ref.to(LAST), path)
    loaded = torch.load(path)
    assert loaded.device == LAST
    assert loaded.dtype == torch.float64
    assert torch.equal(loaded.cpu(), ref)


def test_save_load_preserves_view_sharing_and_strides():
    base_ref = torch.randn(6, 4)
    base = base_ref.to("flagos")
    obj = {"base": base, "t": base.t(), "row": base[2], "ints": torch.arange(5).to("flagos")}
    loaded = torch.load(save_to_bytes(obj))
    assert loaded["t"].stride() == (1, 4)
    assert all(v.device == DEV for v in loaded.values())
    assert torch.equal(loaded["base"].cpu(), base_ref)
    assert torch.equal(loaded["t"].cpu(), base_ref.t())
    assert torch.equal(loaded["row"].cpu(), base_ref[2])
    assert torch.equal(loaded["ints"].cpu(), torch.arange(5))
    # views of one storage are saved once and still alias after loading
    loaded["base"][2].fill_(9.0)
    assert torch.all(loaded["row"].cpu() == 9.0)
    assert torch.all(loaded["t"][:, 2].cpu() == 9.0)


def test_save_load_mixed_cpu_and_flagos_devices():
    a, b, c = torch.randn(2), torch.randn(3), torch.randn(4)
    obj = [a, b.to("flagos:0"), c.to("flagos:1")]
    loaded = torch.load(save_to_bytes(obj))
    assert [t.device for t in loaded] == [torch.device("cpu"), DEV, DEV1]
    for t, ref in zip(loaded, (a, b, c)):
        assert torch.equal(t.cpu(), ref)


def test_map_location_cpu():
    ref = torch.randn(5, 2)
    loaded = torch.load(save_to_bytes(ref.to(LAST)), map_location="cpu")
    assert loaded.device == torch.device("cpu")
    assert torch.equal(loaded, ref)


def test_map_location_flagos_1_from_flagos_0_and_cpu():
    ref = torch.randn(5, 2)
    for source in (ref.to("flagos:0"), ref):
        loaded = torch.load(save_to_bytes(source), map_location="flagos:1")
        assert loaded.device == DEV1
        assert torch.equal(loaded.cpu(), ref)


def test_map_location_torch_device_and_dict():
    ref = torch.randn(3)
    loaded = torch.load(save_to_bytes(ref.to("flagos:0")), map_location=torch.device("flagos", 1))
    assert loaded.device == DEV1
    assert torch.equal(loaded.cpu(), ref)
    loaded = torch.load(save_to_bytes(ref.to("flagos:1")), map_location={"flagos:1": "flagos:0"})
    assert loaded.device == DEV
    assert torch.equal(loaded.cpu(), ref)


def test_map_location_lambda_keeping_storage_on_cpu():
    ref = torch.randn(4)
    seen = []

    def keep(storage, location):
        seen.append(location)
        return storage

    loaded = torch.load(save_to_bytes(ref.to(LAST)), map_location=keep)
    assert seen == [str(LAST)]
    assert loaded.device == torch.device("cpu")
    assert torch.equal(loaded, ref)


def test_map_location_lambda_moving_to_flagos():
    ref = torch.randn(4, 4)
    loaded = torch.load(
        save_to_bytes(ref), map_location=lambda storage, loc: storage.flagos(LAST.index)
    )
    assert loaded.device == LAST
    assert torch.equal(loaded.cpu(), ref)


def _mlp():
    return nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_state_dict_round_trip_to_file(tmp_path):
    model = _mlp()
    model(torch.randn(16, 5))  # non-trivial BatchNorm running stats
    model = model.to("flagos")
    path = tmp_path / "state.pt"
    torch.save(model.state_dict(), path)

    loaded = torch.load(path)
    for key, value in model.state_dict().items():
        assert loaded[key].device == DEV, key
        assert loaded[key].dtype == value.dtype, key
        assert torch.equal(loaded[key].cpu(), value.cpu()), key

    # into a fresh CPU model via map_location, then both models agree
    fresh = _mlp()
    fresh.load_state_dict(torch.load(path, map_location="cpu"))
    fresh.eval()
    model.eval()
    x = torch.randn(6, 5)
    torch.testing.assert_close(model(x.to("flagos")).cpu(), fresh(x), **TOL)


def test_state_dict_round_trip_bytes_into_flagos_model():
    src = _mlp().to("flagos:1")
    buf = save_to_bytes(src.state_dict())
    dst = _mlp().to("flagos:0")
    dst.load_state_dict(torch.load(buf, map_location="flagos:0"))
    for (k, a), (_, b) in zip(src.state_dict().items(), dst.state_dict().items()):
        assert b.device == DEV, k
        assert torch.equal(a.cpu(), b.cpu()), k


def test_weights_only_load_of_flagos_tensors():
    ref = torch.randn(3, 2)
    loaded = torch.load(save_to_bytes({"w": ref.to(LAST)}), weights_only=True)
    assert loaded["w"].device == LAST
    assert torch.equal(loaded["w"].cpu(), ref)


# --- empty tensors (zero-byte storages) ----------------------------------------------


def test_zero_byte_storage_made_by_pytorch_is_on_flagos():
    # PyTorch's storage constructor hands a zero-byte request a CPU-labelled
    # null pointer; the storage must still be flagos'.
    assert torch.UntypedStorage(0, device=LAST).device == LAST
    assert torch.empty(0, device=LAST).untyped_storage().clone().device == LAST


def test_empty_tensor_round_trips_on_its_device():
    for shape in [(0,), (0, 3), (2, 0, 5)]:
        loaded = torch.load(save_to_bytes(torch.empty(shape, device=LAST)))
        assert loaded.device == LAST and loaded.shape == shape
    ckpt = {"empty": torch.empty(0), "w": torch.randn(2)}
    loaded = torch.load(save_to_bytes(ckpt), map_location=str(LAST))
    assert {k: v.device for k, v in loaded.items()} == {"empty": LAST, "w": LAST}
    assert torch.equal(loaded["w"].cpu(), ckpt["w"])


def test_deepcopy_of_module_with_empty_buffer_stays_on_flagos():
    import copy

    m = nn.Linear(4, 3)
    m.register_buffer("mask", torch.empty(0))
    m.to(LAST)
    c = copy.deepcopy(m)
    assert c.mask.device == LAST and c.mask.shape == (0,)
    assert c.weight.device == LAST and torch.equal(c.weight.cpu(), m.weight.cpu())
    target = nn.Linear(4, 3)
    target.register_buffer("mask", torch.empty(0))
    target.load_state_dict(m.state_dict(), assign=True)
    assert target.mask.device == LAST
