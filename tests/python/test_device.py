"""Device discovery and selection: torch.flagos.*, torch.accelerator.*, env config."""

import os
import re
import warnings

import pytest
import torch
import torch.nn as nn

import torch_fl


@pytest.fixture(autouse=True)
def restore_current_device():
    before = torch.flagos.current_device()
    yield
    torch.flagos.set_device(before)


# ---------------------------------------------------------------- discovery


def test_is_available_reports_true():
    assert torch.flagos.is_available() is True
    assert torch.flagos.device_count() >= 1


@pytest.mark.host_only
def test_device_count_follows_flagos_host_devices():
    assert torch_fl.driver() == "host"
    # conftest sets FLAGOS_HOST_DEVICES (2 unless the environment says otherwise)
    assert torch.flagos.device_count() == int(os.environ["FLAGOS_HOST_DEVICES"])


TELEMETRY = ("utilization", "memory_usage", "device_memory_used", "temperature", "power_draw", "clock_rate",
             "list_gpu_processes")


@pytest.mark.host_only
@pytest.mark.parametrize("name", TELEMETRY)
def test_telemetry_on_the_host_driver_raises_naming_the_driver(name):
    with pytest.raises(RuntimeError, match=rf"torch\.flagos\.{name} needs the cuda driver.*'host' driver"):
        getattr(torch.flagos, name)()


@pytest.mark.parametrize("device, error", [("flagos:9", "valid indices are 0"), ("cpu", "expected a flagos device")])
def test_telemetry_checks_its_device_argument_first(device, error):
    with pytest.raises((RuntimeError, ValueError), match=error):
        torch.flagos.utilization(device)


@pytest.mark.cuda
@pytest.mark.parametrize("name", TELEMETRY)
def test_telemetry_is_torch_cudas_on_the_cuda_driver(name):
    # Values move from sample to sample; the type, or the error when NVML is
    # missing, must be torch.cuda's.
    try:
        want = getattr(torch.cuda, name)(0)
    except Exception as error:  # noqa: BLE001
        with pytest.raises(type(error)):
            getattr(torch.flagos, name)("flagos:0")
        return
    got = getattr(torch.flagos, name)("flagos:0")
    assert type(got) is type(want)
    if name == "list_gpu_processes":
        assert got.splitlines()[0] == want.splitlines()[0]


def test_default_current_device_is_zero():
    assert torch.flagos.current_device() == 0


def test_set_device_changes_current_device():
    torch.flagos.set_device(1)
    assert torch.flagos.current_device() == 1
    torch.flagos.set_device("flagos:0")
    assert torch.flagos.current_device() == 0
    torch.flagos.set_device(torch.device("flagos", 1))
    assert torch.flagos.current_device() == 1


def test_new_tensors_go_to_the_current_device():
    torch.flagos.set_device(1)
    t = torch.randn(3, device="flagos")
    assert t.device == torch.device("flagos", 1)
    assert t.get_device() == 1


def test_device_context_sets_and_restores():
    assert torch.flagos.current_device() == 0
    with torch.flagos.device(1):
        assert torch.flagos.current_device() == 1
        assert torch.randn(2, device="flagos").device.index == 1
        with torch.flagos.device(0):
            assert torch.flagos.current_device() == 0
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0


def test_device_context_restores_after_exception():
    with pytest.raises(KeyError):
        with torch.flagos.device(1):
            raise KeyError("boom")
    assert torch.flagos.current_device() == 0


def test_device_of_uses_the_tensor_device():
    t = torch.randn(2, device="flagos:1")
    with torch.flagos.device_of(t):
        assert torch.flagos.current_device() == 1
    assert torch.flagos.current_device() == 0


def test_tensor_on_explicit_index_stays_there_through_ops():
    a = torch.randn(4, 5, device=torch.device("flagos:1"))
    b = torch.randn(4, 5, device="flagos:1")
    assert torch.flagos.current_device() == 0
    c = a * b + 1
    assert c.device == torch.device("flagos", 1)
    torch.testing.assert_close(c.cpu(), a.cpu() * b.cpu() + 1, rtol=1e-6, atol=1e-6)
    # reductions and matmul too
    m = a @ b.t()
    assert m.device == torch.device("flagos", 1)
    torch.testing.assert_close(m.cpu(), a.cpu() @ b.cpu().t(), rtol=1e-5, atol=1e-5)
    s = a.sum()
    assert s.device == torch.device("flagos", 1)
    # the current device was not changed by running on device 1
    assert torch.flagos.current_device() == 0


def test_ops_mixing_devices_raise_a_clear_error():
    a = torch.randn(3, device="flagos:0")
    b = torch.randn(3, device="flagos:1")
    with pytest.raises(RuntimeError, match=r"flagos:0.*flagos:1|flagos:1.*flagos:0"):
        a + b


# ---------------------------------------------------------------- accelerator


def test_current_accelerator_is_flagos():
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == "flagos"
    assert torch.accelerator.is_available()


def test_accelerator_device_count():
    assert torch.accelerator.device_count() == torch.flagos.device_count() >= 1


def test_accelerator_set_and_get_device_index():
    last = torch.flagos.device_count() - 1  # 1 with two devices
    torch.accelerator.set_device_index(last)
    assert torch.accelerator.current_device_index() == last
    assert torch.flagos.current_device() == last
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0
    assert torch.flagos.current_device() == 0


def test_accelerator_device_index_context():
    last = torch.flagos.device_count() - 1
    with torch.accelerator.device_index(last):
        assert torch.flagos.current_device() == last
    assert torch.flagos.current_device() == 0


def test_accelerator_device_capability_lists_the_dtypes_flagos_holds():
    caps = torch.accelerator.get_device_capability("flagos:0")
    dtypes = caps["supported_dtypes"]
    assert isinstance(dtypes, set)
    expected = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
                torch.float8_e4m3fn, torch.float8_e5m2}
    assert expected <= dtypes, expected - dtypes
    # flagos tensors are never quantized: those dtypes are not claimed.
    assert not {torch.qint8, torch.quint8, torch.qint32} & dtypes
    # Every claimed dtype (among the listed ones) can be allocated and converted to.
    src = torch.randn(4, device="flagos")
    for dtype in expected:
        t = src.to(dtype)
        assert t.dtype == dtype and t.device.type == "flagos"
    # The current device by default, and every device alike.
    assert torch.accelerator.get_device_capability() == caps
    last = torch.flagos.device_count() - 1
    assert torch.accelerator.get_device_capability(f"flagos:{last}") == caps


def test_accelerator_device_capability_of_a_missing_device_raises():
    n = torch.flagos.device_count()
    with pytest.raises(RuntimeError, match=rf"{n}.*0\.\.{n - 1}"):
        torch.accelerator.get_device_capability(f"flagos:{n}")


def test_accelerator_synchronize_runs():
    last = torch.flagos.device_count() - 1
    x = torch.randn(64, 64, device="flagos")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(last)
    torch.flagos.synchronize()
    torch.flagos.synchronize(f"flagos:{last}")
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- generated methods


def test_generated_tensor_methods():
    cpu = torch.randn(3, 4)
    t = cpu.flagos()
    assert t.is_flagos and not cpu.is_flagos
    assert t.device == torch.device("flagos", 0)
    torch.testing.assert_close(t.cpu(), cpu, rtol=0, atol=0)
    last = torch.flagos.device_count() - 1
    t1 = cpu.flagos(last)
    assert t1.device == torch.device("flagos", last)
    torch.testing.assert_close(t1.cpu(), cpu, rtol=0, atol=0)


def test_generated_module_method_moves_parameters_and_buffers():
    m = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    ref = [p.detach().clone() for p in m.state_dict().values()]
    out = m.flagos()
    assert out is m
    for value, expected in zip(m.state_dict().values(), ref):
        assert value.is_flagos
        torch.testing.assert_close(value.cpu(), expected, rtol=0, atol=0)


def test_generated_storage_method():
    s = torch.randn(5).untyped_storage()
    fs = s.flagos()
    assert fs.device.type == "flagos"
    assert fs.nbytes() == s.nbytes()
    assert bytes(fs.cpu()) == bytes(s)


def test_registered_ops_include_core_kernels():
    ops = torch_fl.get_registered_ops()
    assert "aten::empty.memory_format" in ops
    assert "aten::_copy_from" in ops
    assert ops == sorted(ops)


def test_python_m_torch_fl_prints_info(subprocesses):
    rc, out, err = subprocesses["python -m torch_fl"].result()
    assert rc == 0, err
    assert "torch_fl" in out
    # The child inherits this process's environment: the same driver and count.
    assert re.search(rf"\bdriver\b\W*{torch_fl.driver()}\b", out), out
    assert re.search(rf"\bdevices\b\W*{torch.flagos.device_count()}\b", out), out
    assert re.search(r"\bdistributed\b\W*c10d backend 'flagos' over (gloo|nccl)", out), out


# ---------------------------------------------------------------- bad input


def _assert_names_index_and_range(message: str, index: int):
    assert str(index) in message, message
    assert f"0..{torch.flagos.device_count() - 1}" in message, message


def test_device_name_and_bf16_support():
    n = torch.flagos.device_count()
    for index in range(n):
        name = torch.flagos.get_device_name(index)
        assert name == torch.flagos.get_device_name(f"flagos:{index}")
        if torch_fl.driver() == "cuda":
            assert name == torch.cuda.get_device_name(index)
        else:
            assert "host" in name
    assert torch.flagos.get_device_name() == torch.flagos.get_device_name(
        torch.flagos.current_device())
    with pytest.raises(RuntimeError, match=rf"{n}.*0\.\.{n - 1}"):
        torch.flagos.get_device_name(n)
    with pytest.raises(ValueError, match="expected a flagos device"):
        torch.flagos.get_device_name("cpu")
    expected = torch.cuda.is_bf16_supported() if torch_fl.driver() == "cuda" else True
    assert torch.flagos.is_bf16_supported() is expected


def test_device_properties_and_capability():
    n = torch.flagos.device_count()
    for index in range(n):
        props = torch.flagos.get_device_properties(index)
        assert props.name == torch.flagos.get_device_name(index)
        if torch_fl.driver() == "cuda":
            cuda = torch.cuda.get_device_properties(index)
            assert (props.total_memory, props.major, props.minor) == (
                cuda.total_memory, cuda.major, cuda.minor)
            assert torch.flagos.get_device_capability(index) == torch.cuda.get_device_capability(
                index)
        else:
            assert props.total_memory == torch.flagos.mem_get_info(index)[1]
            assert props.multi_processor_count == torch.get_num_threads()
            assert "total_memory=" in repr(props)
            with pytest.raises(RuntimeError, match="no compute capability"):
                torch.flagos.get_device_capability(index)
    assert torch.flagos.get_device_properties().name == torch.flagos.get_device_properties(
        torch.flagos.current_device()).name
    with pytest.raises(RuntimeError, match=rf"{n}.*0\.\.{n - 1}"):
        torch.flagos.get_device_properties(n)
    with pytest.raises(ValueError, match="expected a flagos device"):
        torch.flagos.get_device_capability("cpu")


def test_set_device_out_of_range_raises_runtime_error():
    bad = torch.flagos.device_count() + 3
    with pytest.raises(RuntimeError) as info:
        torch.flagos.set_device(bad)
    _assert_names_index_and_range(str(info.value), bad)
    assert torch.flagos.current_device() == 0


def test_device_context_out_of_range_raises_runtime_error():
    bad = torch.flagos.device_count() + 5
    with pytest.raises(RuntimeError) as info:
        with torch.flagos.device(bad):
            pass
    _assert_names_index_and_range(str(info.value), bad)
    assert torch.flagos.current_device() == 0


def test_tensor_on_out_of_range_device_raises():
    bad = torch.flagos.device_count() + 7
    with pytest.raises(RuntimeError) as info:
        torch.randn(2, device=f"flagos:{bad}")
    _assert_names_index_and_range(str(info.value), bad)


def test_accelerator_set_device_index_out_of_range_raises():
    bad = torch.flagos.device_count()  # the first index past the end
    # CUDA's type, and the words PyTorch's reference backend tests for.
    with pytest.raises(RuntimeError, match="The device index is out of range") as info:
        torch.accelerator.set_device_index(bad)
    _assert_names_index_and_range(str(info.value), bad)
    assert torch.flagos.current_device() == 0


def test_set_device_to_other_device_type_raises_value_error():
    with pytest.raises(ValueError, match="flagos"):
        torch.flagos.set_device("cuda:0")
    assert torch.flagos.current_device() == 0


def test_set_device_negative_index_raises_runtime_error():
    with pytest.raises(RuntimeError, match="-3"):
        torch.flagos.set_device(-3)


def test_set_device_with_garbage_raises_type_or_value_error():
    with pytest.raises(ValueError):
        torch.flagos.set_device("not a device")
    with pytest.raises(TypeError):
        torch.flagos.set_device(1.5)


BAD_ENV = [
    # (variable, value, fragments that name the valid choices)
    ("FLAGOS_ACCELERATOR", "tpu", ["auto", "host"]),
    ("FLAGOS_HOST_DEVICES", "abc", ["1", "64"]),
    ("FLAGOS_HOST_DEVICES", "0", ["1", "64"]),
    ("FLAGOS_HOST_DEVICES", "-1", ["1", "64"]),
    ("FLAGOS_HOST_DEVICES", "", ["1", "64"]),
    ("FLAGOS_HOST_MEMORY_LIMIT", "lots", ["MiB", "GiB"]),
    ("FLAGOS_HOST_MEMORY_LIMIT", "-5", ["MiB", "GiB"]),
]


@pytest.fixture(scope="module")
def subprocesses(start_py):
    """Every subprocess this module needs, started at once (importing torch is slow)."""
    procs = {
        "python -m torch_fl": start_py("", module="torch_fl"),
        "retry": start_py(RETRY_SNIPPET, env={"FLAGOS_HOST_DEVICES": "abc",
                                              "FLAGOS_ACCELERATOR": "host"}),
    }
    for var, value, _ in BAD_ENV:
        env = {var: value}
        if var != "FLAGOS_ACCELERATOR":
            env["FLAGOS_ACCELERATOR"] = "host"
        procs[(var, value)] = start_py("import torch_fl\nprint('IMPORTED')", env=env)
    yield procs
    for p in procs.values():
        p.result()


@pytest.mark.parametrize(
    "var,value,choices", BAD_ENV, ids=[f"{v}={x!r}" for v, x, _ in BAD_ENV]
)
def test_bad_env_value_makes_import_fail_with_clear_message(subprocesses, var, value, choices):
    rc, out, err = subprocesses[(var, value)].result()
    assert rc != 0, f"import succeeded with {var}={value!r}: {out}"
    assert "IMPORTED" not in out
    # the last line of the traceback is the exception itself
    last = [line for line in err.strip().splitlines() if line.strip()][-1]
    assert re.match(r"^(\w+\.)*\w*(Error|Exception)\b", last), err
    assert var in last, err
    assert f"'{value}'" in last or f"={value}" in last, err
    for choice in choices:
        assert choice in last, err


RETRY_SNIPPET = r"""
import os
messages = []
for _ in range(2):
    try:
        import torch_fl
    except Exception as e:
        messages.append(f"{type(e).__name__}: {e}")
    else:
        raise SystemExit("import succeeded with FLAGOS_HOST_DEVICES=abc")
assert messages[0] == messages[1], messages
assert "FLAGOS_HOST_DEVICES" in messages[0], messages
os.environ["FLAGOS_HOST_DEVICES"] = "3"
import torch, torch_fl
assert torch.flagos.device_count() == 3, torch.flagos.device_count()
x = torch.randn(4, device="flagos:2")
torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)
print("RECOVERED")
"""


def test_failed_driver_selection_is_retried_after_fixing_env(subprocesses):
    rc, out, err = subprocesses["retry"].result()
    assert rc == 0, err
    assert "RECOVERED" in out


def test_current_device_is_per_thread():
    import threading

    torch.flagos.set_device(1)
    seen = []

    def worker():
        seen.append(torch.flagos.current_device())
        torch.flagos.set_device(0)
        seen.append(torch.randn(1, device="flagos").device.index)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == [0, 0]
    assert torch.flagos.current_device() == 1


def test_forked_child_cannot_use_an_initialised_device():
    import os

    torch.randn(2, device="flagos")  # initialise in this process
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running pytest's teardown
        try:
            os.close(read_fd)
            try:
                torch.randn(2, device="flagos")
                msg = "NO ERROR"
            except RuntimeError as e:
                msg = f"RuntimeError: {e}"
            msg += f"\nbad_fork={torch.flagos._is_in_bad_fork()}"
            os.write(write_fd, msg.encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        message = f.read()
    os.waitpid(pid, 0)
    assert message.startswith("RuntimeError:"), message
    assert "fork" in message and "spawn" in message
    assert "bad_fork=True" in message
    assert not torch.flagos._is_in_bad_fork()


def test_module_to_flagos_keeps_tied_weights():
    """c10 knows only its own dense backends as shallow-copy compatible; flagos
    registers aten::_has_compatible_shallow_copy_type so that Module.to keeps
    each Parameter (and so tied weights) instead of making one per module."""
    emb = torch.nn.Embedding(8, 4)
    head = torch.nn.Linear(4, 8, bias=False)
    head.weight = emb.weight
    param = emb.weight
    model = torch.nn.ModuleList([emb, head]).to("flagos")
    assert model[1].weight is model[0].weight
    assert model[0].weight is param and param.device.type == "flagos"  # optimizers keep it
    model.to("cpu")
    assert model[1].weight is model[0].weight is param and param.device.type == "cpu"


def test_cuda_names_a_ported_script_uses():
    assert torch.flagos.OutOfMemoryError is torch.OutOfMemoryError
    last = torch.flagos.device_count() - 1
    want = torch.cuda.can_device_access_peer(0, last) if torch_fl.driver() == "cuda" else last != 0
    assert torch.flagos.can_device_access_peer(0, f"flagos:{last}") is want
    with pytest.raises(RuntimeError, match="device index is out of range"):
        torch.flagos.can_device_access_peer(0, last + 1)


@pytest.mark.parametrize("mode, value", [("default", 0), ("warn", 1), ("error", 2), (1, 1)])
def test_sync_debug_mode_round_trips(mode, value):
    try:
        torch.flagos.set_sync_debug_mode(mode)
        assert torch.flagos.get_sync_debug_mode() == value
    finally:
        torch.flagos.set_sync_debug_mode(0)
    assert torch.flagos.get_sync_debug_mode() == 0


@pytest.mark.parametrize("bad", ["loud", 3, -1, True, None, 1.0])
def test_sync_debug_mode_refuses_other_values(bad):
    with pytest.raises(RuntimeError, match=r"debug_mode .*'default' \(0\), 'warn' \(1\), 'error' \(2\)"):
        torch.flagos.set_sync_debug_mode(bad)
    assert torch.flagos.get_sync_debug_mode() == 0


def test_sync_debug_mode_warns_where_flagos_waits_for_the_device():
    x = torch.randn(100, device="flagos")
    torch.flagos.set_sync_debug_mode("warn")
    try:
        if torch_fl.driver() == "cuda":  # CUDA's setting: .item() waits for the GPU
            with pytest.warns(UserWarning, match="synchronizing"):
                x.sum().item()
        else:  # the host driver never waits for the device
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                x.sum().item()
    finally:
        torch.flagos.set_sync_debug_mode("default")


def test_a_device_context_object_names_its_device():
    # torch.cuda's device functions take a torch.cuda.device; flagos' said "not device".
    ctx = torch.flagos.device("flagos:1")
    with torch.flagos.device(ctx):
        assert torch.flagos.current_device() == 1
    before = torch.flagos.current_device()
    torch.flagos.set_device(ctx)
    try:
        assert torch.flagos.current_device() == 1
    finally:
        torch.flagos.set_device(before)
