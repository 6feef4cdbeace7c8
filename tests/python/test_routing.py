"""Per-operator routing: config file, FLAGOS_OP_*, precedence, chains, aliases,
the dispatch log, the CPU-fallback policy, the API and the CLI.

Routing is read at import, so most cases run in a fresh interpreter. They are
started together and collected per test to keep the suite fast.
"""

import random
import re
import warnings
import threading

import pytest
import torch

import torch_fl
from conftest import python_kernels, run_py, start_py

# On the host driver `cpu` and `native` are both available (the same zero-copy
# CPU kernels); `cuda`, `flaggems`, `metax` and `ascend` are not. Children whose
# expectations rest on that availability run on the host driver (HOST), so that
# they mean the same on a GPU machine, where the default driver is `cuda`.
HOST = {"FLAGOS_ACCELERATOR": "host"}

PRINT_ROUTE = """
import torch, torch_fl
x = torch.randn(8, device="flagos")
y = x * 3
assert torch.allclose(y.cpu(), x.cpu() * 3)
for r in torch_fl.routing.table("mul"):
    if r.resolved:
        print("ROUTE", r.op, r.backend, r.source, r.cpu_fallback)
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def route_of(out, op="aten::mul.Tensor"):
    for line in out.splitlines():
        if line.startswith("ROUTE " + op + " "):
            return line.split(" ", 2)[2]
    raise AssertionError(f"no route for {op} in:\n{out}")


# ---- precedence -------------------------------------------------------------

def test_default_route_is_native_on_the_host_driver():
    rc, out, err = run_py(PRINT_ROUTE, env=HOST)
    assert rc == 0, err
    assert route_of(out) == "native default False"


def test_file_route_applies_to_every_overload_of_a_base_name(tmp_path):
    conf = write(tmp_path, "b.conf", "mul = cpu\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf})
    assert rc == 0, err
    assert route_of(out) == f"cpu file {conf}:1 False"


def test_overload_line_wins_over_its_base_line(tmp_path):
    conf = write(tmp_path, "b.conf", "mul.Tensor = native\nmul = cpu\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf})
    assert rc == 0, err
    assert route_of(out) == f"native file {conf}:1 False"


def test_env_override_wins_over_the_file(tmp_path):
    conf = write(tmp_path, "b.conf", "mul.Tensor = native\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf,
                                            "FLAGOS_OP_mul": "cpu"})
    assert rc == 0, err
    # env beats file even though the file names the overload and env the base.
    assert route_of(out) == "cpu env FLAGOS_OP_mul False"


def test_env_override_with_overload_uses_double_underscore():
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_OP_mul__Tensor": "cpu"})
    assert rc == 0, err
    assert route_of(out) == "cpu env FLAGOS_OP_mul__Tensor False"


def test_env_override_for_an_op_the_file_does_not_list(tmp_path):
    conf = write(tmp_path, "b.conf", "mm = native\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf,
                                            "FLAGOS_OP_mul": "cpu"})
    assert rc == 0, err
    assert route_of(out) == "cpu env FLAGOS_OP_mul False"


def test_api_route_wins_over_env_and_can_be_removed():
    code = """
import torch, torch_fl
x = torch.randn(4, device="flagos")
def route():
    x * 2
    return [(r.backend, r.source) for r in torch_fl.routing.table("mul") if r.resolved][0]
print("A", route())
torch_fl.routing.set_route("mul", "native")
print("B", route())
torch_fl.routing.set_route("mul", "")
print("C", route())
"""
    rc, out, err = run_py(code, env={"FLAGOS_OP_mul": "cpu"})
    assert rc == 0, err
    assert "A ('cpu', 'env FLAGOS_OP_mul')" in out
    assert "B ('native', 'api')" in out
    assert "C ('cpu', 'env FLAGOS_OP_mul')" in out


# ---- chains and aliases ------------------------------------------------------

def test_chain_takes_the_first_available_backend(tmp_path):
    conf = write(tmp_path, "b.conf", "mul = cuda, flaggems, cpu, native\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf, **HOST})
    assert rc == 0, err
    assert route_of(out).startswith("cpu file ")


@pytest.mark.parametrize("alias", ["flagos", "flagos_python", "flaggems_python", "flaggems"])
def test_spec_aliases_of_flaggems_are_accepted(tmp_path, alias):
    # FlagGems is not available on the host driver, so the chain goes on to cpu.
    conf = write(tmp_path, "b.conf", f"mul = {alias}, cpu\n")
    rc, out, err = run_py(PRINT_ROUTE, env={"FLAGOS_BACKEND_CONFIG": conf, **HOST})
    assert rc == 0, err
    assert route_of(out).startswith("cpu file ")


# ---- strictness: every mistake is an error with its location ------------------

@pytest.mark.parametrize("text, expected", [
    ("mm = cdua\n", ["b.conf:1", "unknown backend 'cdua'", "cuda, cpu, native", "Did you mean 'cuda'?"]),
    ("\n\nsofmax = cpu\n", ["b.conf:3", "unknown operator 'sofmax'", "Did you mean 'softmax'?"]),
    ("mm = cuda\n", ["b.conf:1", "no backend in the chain is available", "Available on this driver: cpu, native"]),
    ("mm = metax\n", ["b.conf:1", "metax driver is not built into this installation"]),
    ("mm cuda\n", ["b.conf:1", "malformed line 'mm cuda'", "expected 'op = backend'"]),
    ("mm = cpu\nmm = native\n", ["b.conf:2", "routed twice", "first at line 1"]),
])
def test_config_mistakes_raise_at_import_with_location(tmp_path, text, expected):
    conf = write(tmp_path, "b.conf", text)
    rc, out, err = run_py("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": conf, **HOST})
    assert rc != 0
    assert "ConfigError" in err
    for piece in expected:
        assert piece in err, f"{piece!r} missing from:\n{err}"


def test_all_mistakes_of_a_file_are_reported_in_one_run(tmp_path):
    conf = write(tmp_path, "b.conf", "mm = cdua\nbad line\nsofmax = cpu\nmul = cpu\n")
    rc, out, err = run_py("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": conf})
    assert rc != 0
    assert "3 routing configuration error(s)" in err
    assert err.index(":1:") < err.index(":2:") < err.index(":3:")


@pytest.mark.parametrize("env, expected", [
    ({"FLAGOS_BACKEND_CONFIG": "/nonexistent/b.conf"}, ["/nonexistent/b.conf", "no such file"]),
    ({"FLAGOS_BACKEND_CONFIG": ""}, ["FLAGOS_BACKEND_CONFIG is set but empty"]),
    ({"FLAGOS_OP_sofmax": "cpu"}, ["FLAGOS_OP_sofmax names no operator", "Did you mean FLAGOS_OP_softmax?"]),
    # compared as variable names: add.Tensor, not the in-place add_.Tensor
    ({"FLAGOS_OP_add__tensor": "cpu"}, ["Did you mean FLAGOS_OP_add__Tensor?"]),
    ({"FLAGOS_OP_add__Tensor": "native", "FLAGOS_OP_add.Tensor": "cpu"},
     ["'add.Tensor' is routed twice, also by FLAGOS_OP_add.Tensor"]),
    ({"FLAGOS_OP_mm": "gpu"}, ["FLAGOS_OP_mm", "unknown backend 'gpu'", "cuda, cpu, native"]),
    ({"FLAGOS_OP_mm": "cuda"}, ["FLAGOS_OP_mm='cuda'", "no backend in the chain is available here"]),
    ({"FLAGOS_OP_mm": ""}, ["FLAGOS_OP_mm", "empty backend"]),
    ({"FLAGOS_CPU_FALLBACK": "sometimes"}, ["FLAGOS_CPU_FALLBACK='sometimes'", "warn (the default), allow or error"]),
    ({"FLAGOS_LOG_DISPATCH": "yes"}, ["FLAGOS_LOG_DISPATCH='yes'", "use 1 or 0"]),
    ({"FLAGOS_DISABLE_FLAGGEMS_PY": "2"}, ["FLAGOS_DISABLE_FLAGGEMS_PY='2'", "use 1 or 0"]),
    ({"FLAGOS_CONFIG_STRICT": "maybe"}, ["FLAGOS_CONFIG_STRICT='maybe'", "use 1 (default) or 0"]),
    ({"FLAGOS_LOG_DISPATCH": "1", "FLAGOS_LOG_FILE": "/nonexistent/dir/log"}, ["FLAGOS_LOG_FILE", "cannot be opened"]),
])
def test_bad_routing_environment_raises_at_import(env, expected):
    rc, out, err = run_py("import torch_fl", env={**env, **HOST})
    assert rc != 0, out
    for piece in expected:
        assert piece in err, f"{piece!r} missing from:\n{err}"


def test_non_strict_mode_warns_and_keeps_valid_entries(tmp_path):
    conf = write(tmp_path, "b.conf", "mm = cdua\nmul = cpu\n")
    code = PRINT_ROUTE.replace("import torch, torch_fl", "import warnings\nwarnings.simplefilter('always')\nimport torch, torch_fl")
    rc, out, err = run_py(code, env={"FLAGOS_BACKEND_CONFIG": conf, "FLAGOS_CONFIG_STRICT": "0"})
    assert rc == 0, err
    assert "unknown backend 'cdua'" in err
    assert route_of(out).startswith("cpu file ")


def test_autoloaded_import_torch_survives_a_bad_config(tmp_path):
    conf = write(tmp_path, "b.conf", "mm = cdua\n")
    code = "import torch\nprint('TORCH OK')\nimport torch_fl\n"
    rc, out, err = run_py(code, env={"FLAGOS_BACKEND_CONFIG": conf})
    assert "TORCH OK" in out, err
    assert rc != 0 and "unknown backend 'cdua'" in err


# ---- CPU fallback policy -------------------------------------------------------

FALLBACK = """
import warnings
warnings.simplefilter("always")
import torch, torch_fl
x = torch.randn(8, device="flagos")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for _ in range(3):
        y = x * 2
    print("WARNINGS", sum("runs on the CPU" in str(m.message) for m in w))
assert torch.allclose(y.cpu(), x.cpu() * 2)
s = [s for s in torch_fl.routing.stats() if s.op == "aten::mul.Tensor"][0]
print("FALLBACKS", s.cpu_fallbacks, s.calls)
"""
# `cuda` is unavailable on the host driver: with strict checking off, the route
# falls back to the CPU.
NON_STRICT_CUDA = {"FLAGOS_CONFIG_STRICT": "0", "FLAGOS_OP_mul": "cuda", **HOST}


def test_fallback_warns_once_per_op_and_is_counted():
    rc, out, err = run_py(FALLBACK, env=dict(NON_STRICT_CUDA))
    assert rc == 0, err
    assert "WARNINGS 1" in out
    assert "FALLBACKS 3 {'cpu': 3}" in out


def test_fallback_allow_is_silent_but_counted():
    rc, out, err = run_py(FALLBACK, env=dict(NON_STRICT_CUDA, FLAGOS_CPU_FALLBACK="allow"))
    assert rc == 0, err
    assert "WARNINGS 0" in out
    assert "FALLBACKS 3" in out


def test_fallback_error_raises_naming_the_op():
    rc, out, err = run_py(FALLBACK, env=dict(NON_STRICT_CUDA, FLAGOS_CPU_FALLBACK="error"))
    assert rc != 0
    assert "aten::mul.Tensor" in err and "FLAGOS_CPU_FALLBACK=error" in err


# ---- dispatch log ----------------------------------------------------------------

LOGGED = """
import torch, torch_fl
x = torch.randn(8, device="flagos")
for _ in range(5):
    y = x * 2
torch_fl.routing.set_route("mul", "cpu")
y = x * 2
"""


def test_dispatch_log_prints_each_op_backend_pair_once():
    rc, out, err = run_py(LOGGED, env={"FLAGOS_LOG_DISPATCH": "1"})
    assert rc == 0, err
    lines = [l for l in err.splitlines() if "aten::mul.Tensor" in l]
    assert lines == ["[flagos dispatch] aten::mul.Tensor -> native (default)",
                     "[flagos dispatch] aten::mul.Tensor -> cpu (api)"], err


def test_dispatch_log_goes_to_file(tmp_path):
    log = tmp_path / "dispatch.log"
    rc, out, err = run_py(LOGGED, env={"FLAGOS_LOG_DISPATCH": "1", "FLAGOS_LOG_FILE": str(log)})
    assert rc == 0, err
    assert "[flagos dispatch]" not in err
    assert "[flagos dispatch] aten::mul.Tensor -> native (default)" in log.read_text()


def test_no_dispatch_log_by_default():
    rc, out, err = run_py(LOGGED)
    assert rc == 0, err
    assert "[flagos dispatch]" not in err


# ---- in-process API ---------------------------------------------------------------

def test_table_shows_a_new_route_before_the_next_call():
    # table() showed the backend of the last call beside the new route's
    # source, until the operator was called again.
    x = torch.randn(4, device="flagos")
    x * x
    row = lambda: next(r for r in torch_fl.routing.table("mul") if r.op == "aten::mul.Tensor")  # noqa: E731
    try:
        torch_fl.routing.set_route("mul", "cpu")
        assert (row().backend, row().source) == ("cpu", "api")
    finally:
        torch_fl.routing.set_route("mul", "")
    assert (row().backend, row().source) == ("native", "default")
    x * x
    assert torch_fl.routing.stats() and row().backend == "native"


@pytest.mark.parametrize("name", ["::mm", "foo::", "a b::c d", "mm."])
def test_set_route_rejects_a_malformed_op_name(name):
    # The config file's grammar refuses these; set_route took some of them.
    with pytest.raises(ValueError, match="malformed op name"):
        torch_fl.routing.set_route(name, "cpu")


def test_a_config_file_that_opens_but_cannot_be_read_is_an_error():
    # Read as an empty config (every route dropped) when read(2) failed.
    rc, out, err = run_py("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": "/proc/self/clear_refs"})
    assert rc != 0 and "cannot read config file '/proc/self/clear_refs'" in err, err


def test_set_route_rejects_unknown_op_and_unavailable_backend():
    with pytest.raises(ValueError, match="unknown operator 'sofmax'.*Did you mean 'softmax'"):
        torch_fl.routing.set_route("sofmax", "cpu")
    if torch_fl.driver() == "host":  # the cuda driver has `cuda`
        with pytest.raises(ValueError, match="no backend in the chain is available here"):
            torch_fl.routing.set_route("mm", "cuda")
    with pytest.raises(ValueError, match="unknown backend 'gpu'"):
        torch_fl.routing.set_route("mm", "gpu")
    with pytest.raises(TypeError):
        torch_fl.routing.set_route("mm", None)


def test_stats_count_calls_per_backend_and_reset():
    torch_fl.routing.reset_stats()
    x = torch.randn(5, device="flagos")
    for _ in range(4):
        torch.neg(x)
    st = {s.op: s for s in torch_fl.routing.stats()}
    if "neg" in torch_fl.flaggems.registered_ops():
        # FlagGems: through its Python wrapper, or launched from C++ once its first call
        # (per kernel key) checked the C++ plan against the wrapper.
        assert torch_fl.routing.flaggems_calls(st["aten::neg"].calls) == 4, st["aten::neg"].calls
        assert set(st["aten::neg"].calls) <= set(torch_fl.routing.FLAGGEMS_KEYS)
    else:
        assert st["aten::neg"].calls == {"native": 4}
    torch_fl.routing.reset_stats()
    assert "aten::neg" not in {s.op for s in torch_fl.routing.stats()}


def test_route_changes_while_threads_run_ops_are_safe():
    errors, stop = [], threading.Event()

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        a_cpu = torch.randn(64, generator=g)
        a = a_cpu.to("flagos")
        while not stop.is_set():
            try:
                torch.testing.assert_close((a * 3 + 1).cpu(), a_cpu * 3 + 1)
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(200):
            torch_fl.routing.set_route("mul", "cpu" if i % 2 else "native")
    finally:
        stop.set()
        for t in threads:
            t.join()
        torch_fl.routing.set_route("mul", "")
    assert not errors, errors[0]


def test_available_backends_and_config_path():
    backends = torch_fl.routing.available_backends()
    if torch_fl.driver() == "host":
        assert backends == ["cpu", "native"]
    else:  # the driver's own backend, and the two every driver has
        assert {"cpu", "native", torch_fl.driver()} <= set(backends), backends
    assert torch_fl.routing.config_path().endswith("backends.conf")


# ---- the CLI -------------------------------------------------------------------

def test_cli_info_routes_and_check_config(tmp_path):
    good = write(tmp_path, "good.conf", "mm = cpu\nadd.Tensor = native  # ok\n")
    bad = write(tmp_path, "bad.conf", "mm = cdua\nbad\nsofmax = cpu\n")
    plain = start_py("", module="torch_fl")  # `python -m torch_fl` means info
    info = run_py("import sys; from torch_fl.__main__ import main; sys.exit(main(['info']))")
    assert info[0] == 0, info[2]
    # The children inherit this process's environment, so its driver.
    driver_line = f"driver        {torch_fl.driver()}"
    for key in ("torch_fl", "torch ", driver_line, "devices", "FlagGems", "config"):
        assert key in info[1]
    routes = run_py("import sys, torch, torch_fl\nx = torch.randn(3, 3, device='flagos'); x @ x\n"
                    "from torch_fl.__main__ import main; sys.exit(main(['routes', '--op', 'mm']))")
    assert routes[0] == 0, routes[2]
    assert "aten::mm " in routes[1] and "native" in routes[1]
    ok = run_py(f"import sys; from torch_fl.__main__ import main; sys.exit(main(['check-config', {good!r}]))")
    assert ok[0] == 0 and "OK" in ok[1], ok
    ko = run_py(f"import sys; from torch_fl.__main__ import main; sys.exit(main(['check-config', {bad!r}]))")
    assert ko[0] == 1, ko
    assert "3 error(s)" in ko[1]
    assert "Did you mean 'cuda'?" in ko[1] and "Did you mean 'softmax'?" in ko[1]
    rc, out, err = plain.result()
    assert rc == 0 and driver_line in out, err


# ---- fuzzing the parser ----------------------------------------------------------

VALID = b"mm = cuda\nadd.Tensor = flaggems, cpu  # x\n\naten::bmm.out=native\n# c\n"


def check_parse(data: bytes):
    entries, errors = torch_fl._C._parse_config(data, "fuzz.conf")
    nlines = data.count(b"\n") + 1
    for line, token, message in errors:
        assert 1 <= line <= nlines, (data, line)
        assert message.startswith(f"fuzz.conf:{line}: ")
    for op, chain, line in entries:
        assert op and chain and 1 <= line <= nlines


def test_parser_fuzz_random_bytes_and_mutations():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    alphabet = b"=,#.:_ \t\r\nabcdmnopstux0123456789\x00\xff"
    for _ in range(3000):
        n = rng.randrange(0, 200)
        if rng.random() < 0.5:
            data = bytes(rng.randrange(256) for _ in range(n))
        else:
            data = bytes(rng.choice(alphabet) for _ in range(n))
        check_parse(data)
    for _ in range(3000):
        data = bytearray(VALID)
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(3)
            pos = rng.randrange(len(data) + 1)
            if op == 0 and data:
                del data[min(pos, len(data) - 1)]
            elif op == 1:
                data.insert(pos, rng.choice(alphabet))
            else:
                data[min(pos, len(data) - 1)] = rng.randrange(256)
        check_parse(bytes(data))
    print(f"parser fuzz: 6000 inputs, seed {seed}")


@pytest.mark.host_only  # replaces the flaggems backend's Python kernels (FlagGems' on the cuda driver)
def test_deterministic_algorithms_keep_calls_off_flaggems():
    """torch.use_deterministic_algorithms(True): FlagGems' kernels promise no
    determinism and raise no alert, so flaggems-routed calls run on the native
    kernels (which take their deterministic path or raise) and count there."""
    x = torch.randn(4, 8, device="flagos")
    marked = lambda t: torch.tanh(t) + 0.25  # noqa: E731  (tells which kernel ran)
    was = torch.are_deterministic_algorithms_enabled()
    with python_kernels({"tanh": marked}):
        try:
            torch_fl.routing.reset_stats()
            torch.use_deterministic_algorithms(True)
            exact = torch.tanh(x)
            torch.use_deterministic_algorithms(False)
            flaggems = torch.tanh(x)
        finally:
            torch.use_deterministic_algorithms(was)
        (calls,) = [s.calls for s in torch_fl.routing.stats() if s.op == "aten::tanh"]
    torch.testing.assert_close(exact.cpu(), torch.tanh(x.cpu()), rtol=0, atol=0)
    torch.testing.assert_close(flaggems.cpu(), torch.tanh(x.cpu()) + 0.25)
    assert calls.get("native") == 1 and torch_fl.routing.flaggems_calls(calls) == 1, calls


def _raises(kind, text):
    """A kernel that raises as FlagGems' do, and counts its calls."""
    def kernel(*args, **kwargs):
        kernel.calls += 1
        raise kind(text)
    kernel.calls = 0
    return kernel


@pytest.mark.host_only  # replaces the flaggems backend's Python kernels (FlagGems' on the cuda driver)
def test_a_flaggems_kernel_that_raises_gives_atens_error_for_invalid_arguments():
    """FlagGems' kernels raise AssertionError or ValueError for arguments where
    ATen raises RuntimeError with its own text: the native kernel then runs the
    same arguments, and its error is the one raised."""
    pairs = [(torch.randn(3), torch.randn(4)), (torch.randn(2, 3), torch.randn(2, 3))]
    dot = _raises(AssertionError, "Shape mismatch")
    with python_kernels({"dot": dot}):
        for a, b in pairs:
            with pytest.raises(RuntimeError) as on_cpu:
                torch.dot(a, b)
            with pytest.raises(type(on_cpu.value)) as on_flagos:
                torch.dot(a.to("flagos"), b.to("flagos"))
            assert str(on_flagos.value) == str(on_cpu.value)
    assert dot.calls == len(pairs)


@pytest.mark.host_only
def test_a_flaggems_kernel_that_raises_for_valid_arguments_keeps_its_error_and_says_the_way_out():
    a, b = torch.randn(5, device="flagos"), torch.randn(5, device="flagos")
    with python_kernels({"dot": _raises(ValueError, "kernel failed to compile")}):
        with pytest.warns(UserWarning, match=r"FlagGems' kernel for dot raised .* FLAGOS_OP_dot=native"):
            with pytest.raises(ValueError, match="kernel failed to compile"):
                torch.dot(a, b)
        torch_fl.routing.set_route("dot", "native")
        torch.testing.assert_close(torch.dot(a, b).cpu(), torch.dot(a.cpu(), b.cpu()))


def _raises_as_cpu(call, *args):
    """call(*args) on CPU copies of flagos `args` (aliasing kept: a view stays a
    view of its base) must raise; returns the exception."""
    with pytest.raises(Exception) as on_cpu:
        call(*args)
    return on_cpu.value


@pytest.mark.host_only
def test_in_place_and_out_flaggems_kernels_that_raise_leave_the_callers_tensors_alone():
    """The native kernel writes copies of the storages an overload writes, with
    every argument on them moved over (aliasing kept, since ATen checks overlap
    before shapes): for invalid arguments it raises ATen's error, for valid ones
    FlagGems' error stands, and the caller's tensors keep their values."""
    kernels = {"tril_": _raises(AssertionError, "needs 2 dims"),
               "mul.out": _raises(ValueError, "Unbroadcastable"),
               "add_.Tensor": _raises(AssertionError, "add_ failed")}
    x, square = torch.randn(4, device="flagos"), torch.randn(3, 3, device="flagos")
    out, one = torch.randn(3, device="flagos"), torch.randn(1, device="flagos")
    cpu = {name: t.cpu() for name, t in [("x", x), ("square", square), ("out", out), ("one", one)]}
    cases = [
        # (call, flagos arguments, the same arguments on the CPU)
        (lambda t: t.tril_(), (x,), (cpu["x"].clone(),)),
        # out= overlapping an input: ATen's overlap error, not the broadcast one
        (lambda a, o: torch.mul(a, o[:2], out=o), (x, out), (cpu["x"], cpu["out"].clone())),
        # an expanded self: "more than one element of the written-to tensor"
        (lambda s, o: s.expand(4).add_(o), (one, x), (cpu["one"].clone(), cpu["x"])),
    ]
    with python_kernels(kernels):
        for call, args, cpu_args in cases:
            expected = _raises_as_cpu(call, *cpu_args)
            with pytest.raises(type(expected)) as got:
                call(*args)
            assert str(got.value) == str(expected)
        with pytest.warns(UserWarning, match="FlagGems' kernel for tril_ raised"):
            with pytest.raises(AssertionError, match="needs 2 dims"):
                square.tril_()
    for name, t in [("x", x), ("square", square), ("out", out), ("one", one)]:
        assert torch.equal(t.cpu(), cpu[name]), name
    assert [k.calls for k in kernels.values()] == [2, 1, 1]


@pytest.mark.host_only
def test_a_flaggems_kernel_out_of_memory_or_interrupted_is_raised_unchecked():
    """Errors that are not about the arguments go to the caller as they are,
    with no native run: arguments ATen refuses would have raised its
    RuntimeError instead."""
    class Interrupt(BaseException):  # as KeyboardInterrupt: no Exception
        pass

    a, b = torch.randn(5, device="flagos"), torch.randn(4, device="flagos")
    for error in (torch.OutOfMemoryError("FlagGems ran out"), Interrupt("stopped")):
        kernel = _raises(lambda text, e=error: e, "")
        with python_kernels({"dot": kernel}):
            with pytest.raises(type(error), match=str(error)):
                torch.dot(a, b)
        assert kernel.calls == 1


@pytest.mark.host_only
def test_a_seeded_flaggems_kernel_that_raises_leaves_the_generator_as_it_was():
    x = torch.empty(64, device="flagos")
    with python_kernels({"normal_": _raises(ValueError, "normal_ failed")}):
        state = torch.flagos.get_rng_state()
        with pytest.warns(UserWarning, match="FlagGems' kernel for normal_ raised"):
            with pytest.raises(ValueError, match="normal_ failed"):
                x.normal_()
        assert torch.equal(torch.flagos.get_rng_state(), state)


@pytest.mark.parametrize("op", ["linear", "softmax", "layer_norm", "matmul"])
def test_a_route_for_an_operator_pytorch_decomposes_is_an_error(op, tmp_path):
    # Accepted, then silently unused: PyTorch runs these operators' composite
    # kernels for every device, and only the operators they call are routed.
    conf = tmp_path / "c.conf"
    conf.write_text(f"{op} = cpu\n")
    rc, out, err = run_py("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": str(conf)})
    assert rc != 0 and f"'{op}' never reaches flagos routing" in err, err
    rc, out, err = run_py("import torch_fl", env={f"FLAGOS_OP_{op}": "cpu"})
    assert rc != 0 and "never reaches flagos routing" in err, err
    with pytest.raises(ValueError, match="never reaches flagos routing"):
        torch_fl.routing.set_route(op, "cpu")
    torch_fl.routing.set_route(op, "")  # clearing one is fine


@pytest.mark.parametrize("op", ["copy_", "_to_copy", "empty.memory_format", "view", "set_"])
def test_a_route_for_an_operator_flagos_serves_itself_is_an_error(op, tmp_path):
    # Copies, allocation, views and metadata run flagos' own kernels on every
    # driver: a route for one was accepted and changed nothing.
    conf = tmp_path / "c.conf"
    conf.write_text(f"{op} = cpu\n")
    rc, out, err = run_py("import torch_fl", env={"FLAGOS_BACKEND_CONFIG": str(conf)})
    assert rc != 0 and f"'{op}' never reaches flagos routing: flagos serves it with a kernel of its own" in err, err
    with pytest.raises(ValueError, match="kernel of its own"):
        torch_fl.routing.set_route(op, "cpu")
    torch_fl.routing.set_route(op, "")  # clearing one is fine


def test_check_config_takes_a_path_object_and_table_refuses_a_non_name(tmp_path):
    # check_config(pathlib.Path) raised pybind's "incompatible function
    # arguments"; table(123) returned [] as if no route matched.
    conf = tmp_path / "c.conf"
    conf.write_text("mm = cpu\nsofmax = cpu\n")
    problems = torch_fl.routing.check_config(conf)
    assert len(problems) == 1 and "sofmax" in str(problems[0])
    with pytest.raises(TypeError, match="file path"):
        torch_fl.routing.check_config(3)
    with pytest.raises(TypeError, match="operator name"):
        torch_fl.routing.table(123)
