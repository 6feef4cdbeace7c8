"""Bad input never crashes, hangs or silently computes something wrong.

Three tables, each case answered by "a clear Python exception whose message
names the culprit" or "a clean success" (where the value is actually valid):

1. Environment (_env_cases): every environment variable torch_fl reads (and
   FLAGGEMS_SOURCE_DIR), set to empty, garbage, huge and
   negative values. Each case is a fresh process in which torch_fl was never
   loaded: fork servers (started with conftest.start_py, one per core) import
   torch once and fork one child per case, which sets the variables, runs the
   torch.backends autoload exactly as ``import torch`` does (it must survive,
   turning the mistake into a warning), imports torch_fl (which must raise the
   error) or uses the device (which must work).
2. API cases (_api_cases): every API that takes a device index or a stream, with
   out-of-range, negative and wrong-type values.
3. FOREIGN_CASES: tensors of another device (CPU, meta, sparse, the other
   flagos device) passed to flagos operators.

Tables 2 and 3 run in child interpreters too (a crash must not take pytest
down): each child reports every case as one JSON line, so a crash or a hang is
pinned to the case that caused it. A child's death by signal, or a case that
never reports within the timeout, fails that case.
"""

import importlib.metadata
import json
import os
import pathlib

import pytest

import torch_fl

_AUTOLOAD_INSTALLED = any(
    ep.value.startswith("torch_fl_autoload")
    for ep in importlib.metadata.entry_points(group="torch.backends"))

# Every case runs in a child on the host driver with two devices (_case_env), so
# no test here needs a second device, or a given driver, in this process
# (conftest._uses_second_device).
USES_DEVICES_IN_CHILDREN_ONLY = True

CHILD_TIMEOUT_S = 90  # an API-table child
CASE_TIMEOUT_S = 60  # one environment case
HUGE_NUMBER = "1" + "0" * 30  # 10**30
HUGE_TEXT = "x" * 10000


def raises(types, *fragments):
    """Expect an exception of one of ``types`` (names, matched along the MRO)
    whose message contains every fragment."""
    if isinstance(types, str):
        types = (types,)
    return {"kind": "raises", "types": list(types), "fragments": list(fragments)}


def ok(check=None, **expect):
    """Expect success; ``check`` is a Python expression over ``result`` (API
    tables) that must be true, ``expect`` fields must match (env table)."""
    return {"kind": "ok", "check": check, "expect": expect}


# ============================================================ 1. environment

# Runs in a process where torch is imported (without the autoload) and
# torch_fl never was: the FLAGOS_* variables of the case are set, then the
# torch.backends autoload runs exactly as `import torch` runs it, then
# `import torch_fl`, then a first operation.
CASE_SNIPPET = r"""
import json, sys, warnings
res = {}
def fail(stage, e):
    res.update(stage=stage, type=type(e).__name__,
               mro=[c.__name__ for c in type(e).__mro__], msg=str(e))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        torch._import_device_backends()  # what `import torch` does at its end
    except BaseException as e:
        fail("import torch", e)
res.setdefault("autoload_warning", any(
    "flagos device is not available" in str(w.message) for w in caught))
res["warnings"] = [str(w.message) for w in caught]
if "stage" not in res:
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch_fl
        res["warnings"] += [str(w.message) for w in caught]
    except BaseException as e:
        fail("import torch_fl", e)
    else:
        try:
            x = torch.arange(4.0, device="flagos")
            res.update(stage="ok", value=(x * 2 + 1).cpu().tolist(),
                       devices=torch.flagos.device_count(), driver=torch_fl.driver())
        except BaseException as e:
            fail("op", e)
print("RESULT " + json.dumps(res))
"""

# A fork server: one interpreter imports torch once (about 1.5 s of CPU) and
# forks a fresh process per case, which sets the case's variables and only
# then loads torch_fl. A fresh interpreter per case would cost ~70 torch
# imports (over a minute of CPU on two cores) for the same coverage: the
# variables are read when torch_fl loads, never before. Several servers run
# in parallel (conftest.start_py), one per core.
FORK_SERVER = r"""
import json, os, select, signal, sys, time
import torch
assert "torch_fl" not in sys.modules, "torch_fl was imported before the case's environment was set"
with open(__CASES_FILE__) as f:  # not inline: -c has a 128 KiB limit
    CASES = json.load(f)
SNIPPET = __SNIPPET__
TIMEOUT = __TIMEOUT__
for cid, env in CASES:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            os.dup2(w, 1)
            os.dup2(w, 2)
            for k in [k for k in os.environ if k.startswith(("FLAGOS_", "FLAGGEMS_"))]:
                del os.environ[k]
            os.environ.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
            for k, v in env.items():
                if v is not None:
                    os.environ[k] = v
            exec(SNIPPET, {"torch": torch})
        except BaseException as e:
            print("SERVER-SIDE ERROR", repr(e))
            code = 3
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    chunks, deadline, hung = [], time.monotonic() + TIMEOUT, False
    while True:
        ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            os.kill(pid, signal.SIGKILL)
            hung = True
            break
        data = os.read(r, 1 << 16)
        if not data:
            break
        chunks.append(data)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    out = b"".join(chunks).decode(errors="replace")
    print("CASE " + json.dumps({"id": cid, "rc": rc, "hung": hung, "out": out}), flush=True)
print("SERVER_DONE", flush=True)
"""


# What a bad value must produce: ValueError (torch_fl.routing.ConfigError is
# one) raised by `import torch_fl`, naming the variable.
BAD = raises("ValueError")


def _env_cases(tmp):
    no_such = os.path.join(tmp, "no-such-dir", "file")
    cases = []

    def add(case_id, env, expect, marks=()):
        cases.append(pytest.param(env, expect, id=case_id, marks=marks))

    def four_bad(var, extra_env=None):
        """empty, garbage, huge number, huge text, negative."""
        for label, value in [("empty", ""), ("garbage", "bogus!"), ("huge-number", HUGE_NUMBER),
                             ("huge-text", HUGE_TEXT), ("negative", "-1")]:
            add(f"{var}={label}", {var: value, **(extra_env or {})}, BAD)

    # ---- the HAL (read when the driver is selected) -------------------------
    four_bad("FLAGOS_ACCELERATOR")
    add("FLAGOS_ACCELERATOR=host", {"FLAGOS_ACCELERATOR": "host"}, ok(driver="host"))

    four_bad("FLAGOS_HOST_DEVICES")
    add("FLAGOS_HOST_DEVICES=65", {"FLAGOS_HOST_DEVICES": "65"}, BAD)
    add("FLAGOS_HOST_DEVICES=64", {"FLAGOS_HOST_DEVICES": "64"}, ok(devices=64))

    four_bad("FLAGOS_HOST_MEMORY_LIMIT")
    add("FLAGOS_HOST_MEMORY_LIMIT=0", {"FLAGOS_HOST_MEMORY_LIMIT": "0"}, BAD)
    # One byte is a valid capacity: the first allocation is a clear OOM.
    add("FLAGOS_HOST_MEMORY_LIMIT=1", {"FLAGOS_HOST_MEMORY_LIMIT": "1"},
        {"kind": "op-raises", "types": ["OutOfMemoryError"],
         "fragments": ["out of memory", "FLAGOS_HOST_MEMORY_LIMIT"]})

    # ---- routing (read at import by torch_fl.routing.reload) -------------------
    for label, value in [("empty", ""), ("garbage", no_such), ("huge-number", HUGE_NUMBER),
                         ("huge-text", HUGE_TEXT), ("negative", "-1")]:
        add(f"FLAGOS_BACKEND_CONFIG={label}", {"FLAGOS_BACKEND_CONFIG": value}, BAD)
    add("FLAGOS_BACKEND_CONFIG=/dev/null", {"FLAGOS_BACKEND_CONFIG": os.devnull}, ok())
    add("FLAGOS_BACKEND_CONFIG=a-directory", {"FLAGOS_BACKEND_CONFIG": tmp}, BAD)

    four_bad("FLAGOS_OP_mm")
    for label, name in [("empty", ""), ("garbage", "bogus"), ("huge-number", HUGE_NUMBER),
                        ("huge-text", HUGE_TEXT), ("negative", "-1")]:
        add(f"FLAGOS_OP_<{label}>", {f"FLAGOS_OP_{name}": "cpu"}, BAD)

    four_bad("FLAGOS_CPU_FALLBACK")

    four_bad("FLAGOS_LOG_DISPATCH")

    # FLAGOS_LOG_FILE is opened only when FLAGOS_LOG_DISPATCH=1. Values are
    # paths under tmp, so "huge number" and "negative" are valid file names.
    log_on = {"FLAGOS_LOG_DISPATCH": "1"}
    add("FLAGOS_LOG_FILE=empty", {"FLAGOS_LOG_FILE": "", **log_on}, BAD)
    add("FLAGOS_LOG_FILE=garbage", {"FLAGOS_LOG_FILE": no_such, **log_on}, BAD)
    add("FLAGOS_LOG_FILE=huge-text", {"FLAGOS_LOG_FILE": os.path.join(tmp, HUGE_TEXT), **log_on}, BAD)
    add("FLAGOS_LOG_FILE=a-directory", {"FLAGOS_LOG_FILE": tmp, **log_on}, BAD)
    add("FLAGOS_LOG_FILE=huge-number", {"FLAGOS_LOG_FILE": os.path.join(tmp, HUGE_NUMBER), **log_on},
        ok(log_file=os.path.join(tmp, HUGE_NUMBER)))
    add("FLAGOS_LOG_FILE=negative", {"FLAGOS_LOG_FILE": os.path.join(tmp, "-1"), **log_on},
        ok(log_file=os.path.join(tmp, "-1")))
    add("FLAGOS_LOG_FILE=garbage-without-log", {"FLAGOS_LOG_FILE": no_such}, ok())

    four_bad("FLAGOS_CONFIG_STRICT")
    add("FLAGOS_CONFIG_STRICT=0", {"FLAGOS_CONFIG_STRICT": "0", "FLAGOS_OP_mm": "bogus"},
        ok(warning="FLAGOS_OP_mm"))

    four_bad("FLAGOS_DISABLE_FLAGGEMS_PY")

    # A FLAGOS_* name torch_fl does not know: a warning naming it and the closest known name.
    add("FLAGOS_<misspelled>", {"FLAGOS_BACKEND_CONFG": "all-cuda.conf"},
        ok(warning="unknown environment variable FLAGOS_BACKEND_CONFG is ignored; "
                   "did you mean FLAGOS_BACKEND_CONFIG?"))
    add("FLAGOS_<unknown>", {"FLAGOS_SPEED": "max"},
        ok(warning="unknown environment variable FLAGOS_SPEED is ignored; torch_fl reads "
                   "FLAGOS_ACCELERATOR"))

    # Where FlagGems' kernel sources are (docs/flaggems_cpp.md): checked at import on
    # every driver, so a wrong value is named before anything runs.
    for label, value in [("garbage", no_such), ("huge-text", HUGE_TEXT), ("a-file", os.devnull)]:
        add(f"FLAGGEMS_SOURCE_DIR={label}", {"FLAGGEMS_SOURCE_DIR": value}, BAD)
    return cases


def test_every_flagos_variable_the_project_uses_is_known():
    # torch_fl warns about FLAGOS_* names it does not know (torch_fl/_env_names.py):
    # a variable read by torch_fl, the build or the project's tools must be listed there.
    import re

    from torch_fl import _env_names

    root = pathlib.Path(__file__).resolve().parents[2]
    used = {}
    files = [root / ".ci" / "run", root / "CMakeLists.txt", *root.glob("cmake/*.cmake")]
    for folder in ("torch_fl", "tests", "bench", "scripts", "examples", "csrc"):
        files += [p for p in (root / folder).rglob("*")
                  if p.suffix in (".py", ".sh", ".cpp", ".h", ".conf", ".txt")]
    # As an environment variable. C++ and CMake: read by getenv, env_value & co., $ENV{};
    # elsewhere any quoted name, $NAME, ${NAME} or NAME= (macros and CMake options are not).
    name = r"(FLAGOS_[A-Z0-9_]*[A-Z0-9])"
    native = re.compile(r"(?:getenv|env_[a-z_]+|ScopedEnv [a-z]+)\(\"" + name + r"\"|\$ENV\{" + name)
    script = re.compile(r"[\"']" + name + r"[\"']|\$\{?" + name + r"|(?<![\w-])" + name + "=")
    for path in files:
        if not path.is_file() or path.name == "test_bad_input.py":
            continue
        pattern = native if path.suffix in (".cpp", ".h", ".cmake", ".txt") else script
        for groups in pattern.findall(path.read_text(errors="replace")):
            for n in filter(None, groups if isinstance(groups, tuple) else (groups,)):
                used.setdefault(n, path.relative_to(root))
    unknown = {n: str(p) for n, p in used.items()
               if n not in _env_names.KNOWN and not n.startswith("FLAGOS_OP_")}
    assert not unknown, f"FLAGOS_* variables missing from torch_fl/_env_names.py: {unknown}"
    assert {"FLAGOS_BACKEND_CONFIG", "FLAGOS_ACCELERATOR", "FLAGOS_TEST_SHARD"} <= set(used)


def _case_env(env):
    # Every case starts from the default configuration (one variable at a time),
    # on the host driver unless the case sets FLAGOS_ACCELERATOR itself.
    base = {k: None for k in os.environ if k.startswith(("FLAGOS_", "FLAGGEMS_"))}
    base["FLAGOS_ACCELERATOR"] = "host"
    base.update(env)
    return base


def _env_key(env):
    return json.dumps(env, sort_keys=True)


# ============================================================ 2. device indices and streams

# (label, source of the value, expectation)
BAD_INDICES = [
    ("2", "2", raises("RuntimeError", "2", "0..1")),
    ("7", "7", raises("RuntimeError", "7", "0..1")),
    ("10**30", "10**30", raises("RuntimeError", HUGE_NUMBER)),
    ("-2", "-2", raises("RuntimeError", "-2")),
    ("-1000", "-1000", raises("RuntimeError", "-1000")),
    ("1.0", "1.0", raises("TypeError", "float")),
    ("0.5", "0.5", raises("TypeError", "float")),
    ("True", "True", raises("TypeError", "True")),
    ("'gpu'", "'gpu'", raises("ValueError", "'gpu'")),
    ("''", "''", raises("ValueError", "''")),
    ("'x'*10000", "'x'*10000", raises("ValueError", "xxxxxxxxxx")),
    ("'flagos:x'", "'flagos:x'", raises("ValueError", "flagos:x")),
    ("'flagos:2'", "'flagos:2'", raises("RuntimeError", "2", "0..1")),
    # PyTorch's device parser wraps 128 to the int8 index -128.
    ("'flagos:128'", "'flagos:128'", raises("RuntimeError", "128")),
    ("[0]", "[0]", raises("TypeError", "list")),
    ("cuda-device", "torch.device('cuda', 0)", raises("ValueError", "cuda")),
    ("'cuda:0'", "'cuda:0'", raises("ValueError", "cuda")),
]
GOOD_INDICES = [
    ("None", "None", ok()),
    ("-1", "-1", ok()),
    ("1", "1", ok()),
    ("'flagos:1'", "'flagos:1'", ok()),
    ("device-1", "torch.device('flagos', 1)", ok()),
]
INDEX_APIS = {
    "set_device": "F.set_device({v})",
    "device": "with F.device({v}): pass",
    "synchronize": "F.synchronize({v})",
    "memory_allocated": "result = F.memory_allocated({v})",
    "memory_reserved": "result = F.memory_reserved({v})",
    "max_memory_allocated": "result = F.max_memory_allocated({v})",
    "max_memory_reserved": "result = F.max_memory_reserved({v})",
    "memory_stats": "result = F.memory_stats({v})",
    "reset_peak_memory_stats": "F.reset_peak_memory_stats({v})",
    "reset_accumulated_memory_stats": "F.reset_accumulated_memory_stats({v})",
    "mem_get_info": "result = F.mem_get_info({v})",
    "get_rng_state": "result = F.get_rng_state({v})",
    "set_rng_state": "F.set_rng_state(F.get_rng_state(0), {v})",
    "Stream": "result = F.Stream(device={v})",
    "current_stream": "result = F.current_stream({v})",
    "default_stream": "result = F.default_stream({v})",
}


CREATION_APIS = {
    "randn": "result = torch.randn(2, device={d})",
    "empty": "result = torch.empty(2, 3, device={d})",
    "zeros": "result = torch.zeros(2, device={d})",
    "tensor": "result = torch.tensor([1.0, 2.0], device={d})",
    "to": "result = torch.ones(2).to({d})",
    "Generator": "result = torch.Generator(device={d})",
    "UntypedStorage": "result = torch.UntypedStorage(4, device={d})",
}
CREATION_DEVICES = [
    ("'flagos:2'", "'flagos:2'", raises("RuntimeError", "2", "0..1"), ()),
    ("device-7", "torch.device('flagos', 7)", raises("RuntimeError", "7", "0..1"), ()),
    ("'flagos:-2'", "'flagos:-2'", raises("RuntimeError", "flagos:-2"), ()),
    ("'flagos:x'", "'flagos:x'", raises("RuntimeError", "flagos:x"), ()),
    ("'flagos:128'", "'flagos:128'", raises("RuntimeError", "128"),
     ()),
    ("'flagos:1'", "'flagos:1'", ok("result.device == torch.device('flagos', 1)"), ()),
]

DT = "F.current_stream().device_type"
STREAM_VALUES = [
    ("5", "5", raises("ValueError", "5")),
    ("'x'", "'x'", raises("ValueError", "'x'")),
    ("[0]", "[0]", raises("ValueError", "[0]")),
    ("cuda-device", "torch.device('cuda')", raises("ValueError", "cuda")),
    ("cpu-stream", "torch.Stream(device='cpu')", raises("ValueError", "cpu")),
    ("unknown-id", f"torch.Stream(stream_id=9999, device_index=0, device_type={DT})",
     raises("RuntimeError", "9999")),
    ("negative-id", f"torch.Stream(stream_id=-5, device_index=0, device_type={DT})",
     raises("RuntimeError", "-5")),
    ("huge-id", f"torch.Stream(stream_id=2**62, device_index=0, device_type={DT})",
     raises("RuntimeError", str(2**62))),
    ("device-5", f"torch.Stream(stream_id=0, device_index=5, device_type={DT})",
     raises("RuntimeError", "5", "0..1")),
]

MISC_API_CASES = [
    # torch.flagos.stream / set_stream
    ("stream(None)", "with F.stream(None): result = F.current_stream()",
     ok("result == F.default_stream()")),
    ("stream(device-1 stream)",
     "s = F.Stream(device=1)\nwith F.stream(s): result = (F.current_device(), F.current_stream(1) == s)\n"
     "result = result + (F.current_device(), F.current_stream(1) == F.default_stream(1))",
     ok("result == (1, True, 0, True)")),
    ("set_stream(5)", "F.set_stream(5)", raises(("TypeError", "ValueError", "AttributeError"), "int")),
    ("set_stream(cpu-stream)", "F.set_stream(torch.Stream(device='cpu'))", raises("ValueError", "cpu")),
    ("set_stream(unknown-id)",
     f"F.set_stream(torch.Stream(stream_id=9999, device_index=0, device_type={DT}))",
     raises("RuntimeError", "9999")),
    ("accelerator.set_stream(unknown-id)",
     f"torch.accelerator.set_stream(torch.Stream(stream_id=9999, device_index=0, device_type={DT}))",
     raises("RuntimeError", "9999")),
    ("Event.record(unknown-id)",
     f"torch.Event(device='flagos').record(torch.Stream(stream_id=9999, device_index=0, device_type={DT}))",
     raises("RuntimeError", "9999")),
    ("Stream.query(device-5)",
     f"torch.Stream(stream_id=0, device_index=5, device_type={DT}).query()",
     raises("RuntimeError", "5")),
    ("Stream.synchronize(unknown-id)",
     f"torch.Stream(stream_id=9999, device_index=0, device_type={DT}).synchronize()",
     raises("RuntimeError", "9999")),
    # stream priority
    ("Stream(priority='x')", "F.Stream(priority='x')", raises("TypeError", "priority")),
    ("Stream(priority=1.5)", "F.Stream(priority=1.5)", raises("TypeError", "priority")),
    ("Stream(priority=10**30)", "F.Stream(priority=10**30)", raises(("ValueError", "OverflowError"), "Overflow")),
    ("Stream(priority=-100)", "result = F.Stream(priority=-100)", ok("result.device.type == 'flagos'")),
    # RNG state and seeds
    ("set_rng_state(list)", "F.set_rng_state([1, 2])", raises("TypeError", "list")),
    ("set_rng_state(None)", "F.set_rng_state(None)", raises("TypeError", "NoneType")),
    ("set_rng_state(short)", "F.set_rng_state(torch.zeros(3, dtype=torch.uint8))",
     raises("ValueError", "3 bytes")),
    ("set_rng_state(float)", "F.set_rng_state(torch.zeros(5056))", raises("TypeError", "uint8")),
    ("set_rng_state(flagos tensor)", "F.set_rng_state(F.get_rng_state().to('flagos'))",
     raises("RuntimeError", "CPU")),
    ("set_rng_state(garbage bytes)", "F.set_rng_state(torch.full((5056,), 255, dtype=torch.uint8))",
     raises("RuntimeError", "state")),
    ("manual_seed('x')", "F.manual_seed('x')", raises("ValueError", "'x'")),
    ("manual_seed(2**70)", "F.manual_seed(2**70)", raises(("ValueError", "OverflowError", "RuntimeError"), "Overflow")),
    ("manual_seed(None)", "F.manual_seed(None)", raises("TypeError", "NoneType")),
    ("randn(generator=cpu)", "torch.randn(2, device='flagos', generator=torch.Generator())",
     raises("RuntimeError", "generator", "cpu")),
    # A flagos generator for CPU tensors: refused as CUDA's is.
    ("rand(generator=flagos) on cpu", "torch.rand(3, generator=torch.Generator(device='flagos'))",
     raises("RuntimeError", "Expected a 'cpu' device type for generator but found 'flagos'",
            "aten::uniform_")),  # rand fills an empty CPU tensor
    ("multinomial(cpu, generator=flagos)",
     "torch.multinomial(torch.ones(3), 2, generator=torch.Generator(device='flagos'))",
     raises("RuntimeError", "'cpu'", "found 'flagos'", "aten::multinomial")),
    ("cpu.normal_(generator=flagos)",
     "torch.empty(3).normal_(generator=torch.Generator(device='flagos'))",
     raises("RuntimeError", "'cpu'", "found 'flagos'")),
    # torch.accelerator (PyTorch's device-generic API) reaches the C++ runtime
    # without torch.flagos's Python checks.
    ("accelerator.set_device_index(5)", "torch.accelerator.set_device_index(5)",
     raises("RuntimeError", "5", "0..1")),
    ("accelerator.set_device_index(-5)", "torch.accelerator.set_device_index(-5)",
     ok()),  # documented: a no-op for a negative index
    ("accelerator.synchronize(5)", "torch.accelerator.synchronize(5)", raises("RuntimeError", "5")),
    ("accelerator.current_stream(5)", "torch.accelerator.current_stream(5)", raises("RuntimeError", "5")),
    ("accelerator.memory_allocated(5)", "torch.accelerator.memory_allocated(5)", raises("RuntimeError", "5")),
]
# Negative indices other than -1 at the C++ entry points.
ACCELERATOR_NEGATIVE = [
    ("accelerator.synchronize(-5)", "torch.accelerator.synchronize(-5)"),
    ("accelerator.current_stream(-5)", "result = torch.accelerator.current_stream(-5)"),
    ("accelerator.memory_allocated(-5)", "result = torch.accelerator.memory_allocated(-5)"),
    ("accelerator.memory_stats(-5)", "result = torch.accelerator.memory_stats(-5)"),
    ("accelerator.reset_peak_memory_stats(-5)", "torch.accelerator.reset_peak_memory_stats(-5)"),
    ("accelerator.synchronize('flagos:128')", "torch.accelerator.synchronize('flagos:128')"),
    ("accelerator.memory_allocated('flagos:128')",
     "result = torch.accelerator.memory_allocated('flagos:128')"),
]


def _api_cases():
    cases = []
    for api, template in INDEX_APIS.items():
        for label, src, expect in BAD_INDICES + GOOD_INDICES:
            cases.append((f"{api}[{label}]", template.format(v=src), expect, ()))
    for api, template in CREATION_APIS.items():
        for label, src, expect, marks in CREATION_DEVICES:
            if api == "UntypedStorage" and label == "'flagos:128'":
                marks = ()  # its path validates the index: it raises already
            cases.append((f"{api}[{label}]", template.format(d=src), expect, marks))
    for label, src, expect in STREAM_VALUES:
        cases.append((f"stream[{label}]", f"with F.stream({src}): pass", expect, ()))
    for case_id, code, expect in MISC_API_CASES:
        cases.append((case_id, code, expect, ()))
    for case_id, code in ACCELERATOR_NEGATIVE:
        cases.append((case_id, code, raises("RuntimeError", "-5" if "-5" in code else "128"),
                      ()))
    return cases


# ============================================================ 3. foreign tensors

SAME_DEVICE = "Expected all tensors to be on the same device"
UPSTREAM_META = pytest.mark.xfail(strict=True, reason=(
    "PyTorch: the Meta dispatch key outranks every backend, and these operators' Meta "
    "kernels do not check devices: they allocate the output on the first argument's "
    "device and compute nothing, so the result is uninitialised memory. The same call "
    "with a CPU tensor instead of the flagos one returns garbage too; torch_fl's kernels "
    "are never reached"))

F0 = "torch.ones(2, device='flagos')"
FOREIGN_CASES = [
    # CPU tensors: only a 0-dim CPU tensor (a scalar) or a CPU index mixes in, as on CUDA
    ("flagos + cpu", f"{F0} + torch.ones(2)", raises("RuntimeError", SAME_DEVICE, "flagos:0 and cpu"), ()),
    ("cpu + flagos", f"torch.ones(2) + {F0}", raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("flagos.add_(cpu)", f"{F0}.add_(torch.ones(2))", raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("cpu.add_(flagos)", f"torch.ones(2).add_({F0})", raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("add(out=cpu)", f"torch.add({F0}, 1, out=torch.empty(2))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("mm(flagos, cpu)", "torch.mm(torch.ones(2, 2, device='flagos'), torch.ones(2, 2))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("linear(cpu weight)",
     "torch.nn.functional.linear(torch.ones(2, 2, device='flagos'), torch.ones(2, 2))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("cat([flagos, cpu])", f"torch.cat([{F0}, torch.ones(2)])", raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("index_select(cpu index)", "torch.arange(5.0, device='flagos').index_select(0, torch.tensor([1]))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("embedding(cpu indices)",
     "torch.nn.functional.embedding(torch.tensor([0, 1]), torch.ones(3, 2, device='flagos'))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("where(cpu other)", f"torch.where({F0} > 0, torch.zeros(2), {F0})",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("index_put_(cpu values)", f"{F0}.index_put_((torch.tensor([0, 1]),), torch.tensor([5.0, 6.0]))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("lerp_(cpu end)", f"{F0}.lerp_(torch.ones(2), 0.5)", raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    ("sdpa(cpu key)", "torch.nn.functional.scaled_dot_product_attention("
     "torch.ones(1, 2, 4, device='flagos'), torch.ones(1, 2, 4), torch.ones(1, 2, 4, device='flagos'))",
     raises("RuntimeError", "cpu"), ()),
    ("flagos + cpu scalar", f"result = ({F0} + torch.tensor(3.0)).cpu()",
     ok("result.tolist() == [4.0, 4.0]"), ()),
    ("where(cpu scalar)", f"result = torch.where({F0} > 0, torch.tensor(5.0), {F0}).cpu()",
     ok("result.tolist() == [5.0, 5.0]"), ()),
    ("flagos[cpu index]", "result = torch.arange(5.0, device='flagos')[torch.tensor([1, 3])]",
     ok("result.device.type == 'flagos' and result.cpu().tolist() == [1.0, 3.0]"), ()),
    ("conv1d(cpu weight)",
     "torch.nn.functional.conv1d(torch.ones(1, 1, 4, device='flagos'), torch.ones(1, 1, 2))",
     raises("RuntimeError", "cpu"), ()),
    ("conv1d(cpu bias)", "torch.nn.functional.conv1d(torch.ones(1, 1, 4, device='flagos'), "
     "torch.ones(1, 1, 2, device='flagos'), torch.ones(1))",
     raises("RuntimeError", "cpu"), ()),
    ("conv1d(cpu input, flagos weight)",
     "torch.nn.functional.conv1d(torch.ones(1, 1, 4), torch.ones(1, 1, 2, device='flagos'))",
     raises("RuntimeError", SAME_DEVICE, "cpu"), ()),
    # the other flagos device
    ("flagos:0 + flagos:1", "torch.ones(2, device='flagos:0') + torch.ones(2, device='flagos:1')",
     raises("RuntimeError", SAME_DEVICE, "flagos:0", "flagos:1"), ()),
    ("mm(flagos:1, flagos:0)",
     "torch.mm(torch.ones(2, 2, device='flagos:1'), torch.ones(2, 2, device='flagos:0'))",
     raises("RuntimeError", SAME_DEVICE, "flagos:1", "flagos:0"), ()),
    ("conv1d(flagos:1 weight)", "torch.nn.functional.conv1d(torch.ones(1, 1, 4, device='flagos:0'), "
     "torch.ones(1, 1, 2, device='flagos:1'))",
     raises("RuntimeError", "flagos:1"), ()),
    ("flagos:1 tensor copied to flagos:0", "result = torch.ones(2, device='flagos:1').to('flagos:0')",
     ok("result.device == torch.device('flagos', 0) and result.cpu().tolist() == [1.0, 1.0]"), ()),
    # meta tensors
    ("flagos + meta", f"{F0} + torch.ones(2, device='meta')", raises("RuntimeError", "meta"), ()),
    ("meta + flagos", f"torch.ones(2, device='meta') + {F0}", raises("RuntimeError", "meta"), ()),
    ("mv(flagos, meta)", "torch.mv(torch.ones(3, 3, device='flagos'), torch.ones(3, device='meta'))",
     raises("RuntimeError", "meta"), ()),
    ("dot(flagos, meta)", "torch.dot(torch.ones(3, device='flagos'), torch.ones(3, device='meta'))",
     raises("RuntimeError", "meta"), ()),
    ("masked_fill(meta mask)",
     f"{F0}.masked_fill(torch.ones(2, dtype=torch.bool, device='meta'), 0)",
     raises("RuntimeError", "meta"), ()),
    ("meta.to(flagos)", "torch.ones(2, device='meta').to('flagos')", raises("NotImplementedError", "meta"), ()),
    ("flagos.copy_(meta)", f"{F0}.copy_(torch.ones(2, device='meta'))",
     raises("NotImplementedError", "meta"), ()),
    ("flagos.to(meta)", f"result = {F0}.to('meta')", ok("result.device.type == 'meta'"), ()),
    ("mm(flagos, meta)", "torch.mm(torch.ones(2, 2, device='flagos'), torch.ones(2, 2, device='meta'))",
     raises("RuntimeError", "meta"), (UPSTREAM_META,)),
    ("addmm(.., meta)", "torch.addmm(torch.ones(3, 3, device='flagos'), torch.ones(3, 3, device='flagos'), "
     "torch.ones(3, 3, device='meta'))", raises("RuntimeError", "meta"), (UPSTREAM_META,)),
    ("flagos[meta index]", "torch.arange(3.0, device='flagos')[torch.tensor([0, 1], device='meta')]",
     raises("RuntimeError", "meta"), (UPSTREAM_META,)),
    ("gather(meta index)",
     f"{F0}.gather(0, torch.zeros(2, dtype=torch.long, device='meta'))",
     raises("RuntimeError", "meta"), (UPSTREAM_META,)),
    ("conv1d(meta weight)",
     "torch.nn.functional.conv1d(torch.ones(1, 1, 4, device='flagos'), torch.ones(1, 1, 2, device='meta'))",
     raises("RuntimeError", "meta"), (UPSTREAM_META,)),
    # sparse
    ("flagos + sparse cpu", f"{F0} + torch.ones(2).to_sparse()",
     raises("RuntimeError", "same device", "flagos:0", "cpu", "aten::add.Tensor"), ()),
    ("sparse flagos + cpu", "torch.ones(2).to_sparse().to('flagos') + torch.ones(2)",
     raises("RuntimeError", "same device", "flagos:0", "cpu", "aten::add.Tensor"), ()),
    ("sparse flagos.cumsum()", "torch.ones(2).to_sparse().to('flagos').cumsum(0)",
     raises("NotImplementedError", "aten::cumsum", "sparse COO", "there is none", ".to_dense()"), ()),
    ("sparse csr flagos.softmax()", "torch.eye(3).to_sparse_csr().to('flagos').softmax(1)",
     raises("NotImplementedError", "sparse compressed", "there is none", ".to_dense()"), ()),
    # a kernel's result of a layout flagos has no twin for is refused with flagos' words
    ("flagos.to_mkldnn()", "torch.eye(3, device='flagos').to_mkldnn()",
     raises("NotImplementedError", "layout Mkldnn", "strided, nested or sparse",
            ".cpu().to_mkldnn()"), ()),
    # an operator only CUDA implements, on the host driver: named with the CPU's backend name
    ("cuda-only op on the host", "torch.ops.aten._cudnn_rnn_flatten_weight("
     "[torch.ones(4, device='flagos')], 1, 4, 4, 4, 0, 1, False, False)",
     raises("NotImplementedError", "_cudnn_rnn_flatten_weight has no CPU kernel for flagos",
            "'host' driver"), ()),
    # quantized: a quantized result is refused, never handed back without its quantizer
    ("quantize_per_tensor(flagos)",
     "torch.quantize_per_tensor(torch.ones(2, device='flagos'), 0.1, 0, torch.qint8)",
     raises("NotImplementedError", "quantized", "QInt8", ".dequantize()"), ()),
    ("quantized cpu .to(flagos)",
     "torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8).to('flagos')",
     raises("NotImplementedError", "quantized", ".dequantize()"), ()),
    # nested: an operator the native device has no nested kernel for, refused with a way out
    ("nested(flagos).cumsum(1)",
     "torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], device='flagos').cumsum(1)",
     raises("NotImplementedError", "aten::cumsum", "nested", "there is none", ".to_padded_tensor"), ()),
    # nested attention refuses what the CPU refuses, in its words
    ("sdpa(nested flagos, attn_mask)",
     "q = torch.nested.nested_tensor([torch.ones(2, 4, 8), torch.ones(2, 6, 8)], device='flagos'); "
     "torch.nn.functional.scaled_dot_product_attention(q, q, q, "
     "attn_mask=torch.ones(2, 2, 4, 4, dtype=torch.bool, device='flagos'))",
     raises("RuntimeError", "Nested tensors", "not supported when an explicit attn_mask"), ()),
    ("sdpa(nested flagos, dense key)",
     "q = torch.nested.nested_tensor([torch.ones(2, 4, 8), torch.ones(2, 6, 8)], device='flagos'); "
     "k = torch.ones(2, 2, 4, 8, device='flagos'); "
     "torch.nn.functional.scaled_dot_product_attention(q, k, k)",
     raises("RuntimeError", "nested self and non-nested other"), ()),
]


# ============================================================ running the children

API_RUNNER = r"""
import json, sys
import torch, torch_fl
F = torch.flagos
CASES = __CASES__
def emit(kind, payload):
    sys.stdout.write(kind + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()
for cid, code, check in CASES:
    emit("START", cid)
    ns = {"torch": torch, "F": F, "torch_fl": torch_fl}
    try:
        exec(code, ns)
        passed = None if not check else bool(eval(check, ns))
        emit("RESULT", {"id": cid, "ok": True, "check": passed,
                        "repr": repr(ns.get("result"))[:300]})
    except BaseException as e:
        emit("RESULT", {"id": cid, "ok": False, "type": type(e).__name__,
                        "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)[:20000]})
    finally:
        # Each case starts from device 0 and the default streams (set_stream
        # also makes the stream's device current: the device comes last).
        try:
            for d in range(F.device_count()):
                torch.accelerator.set_stream(F.default_stream(d))
            torch.accelerator.set_device_index(0)
        except BaseException as e:
            emit("RESULT", {"id": cid + " (cleanup)", "ok": False, "type": type(e).__name__,
                            "mro": [], "msg": str(e)})
print("ALL_DONE")
"""

API_CHUNKS = 3


def _parse_api_output(case_ids, proc):
    rc, out, err = proc.result()
    results, started = {}, []
    for line in out.splitlines():
        if line.startswith("START "):
            started.append(json.loads(line[6:]))
        elif line.startswith("RESULT "):
            r = json.loads(line[7:])
            results[r["id"]] = r
    finished = "ALL_DONE" in out
    for cid in case_ids:
        if cid in results:
            continue
        if started and started[-1] == cid:
            why = (f"the child died (return code {rc}) while running this case" if rc != 0
                   else "the case never reported")
        else:
            why = f"not reached: the child stopped (rc {rc}) at case {started[-1] if started else None!r}"
        results[cid] = {"id": cid, "crash": why, "stderr": err[-3000:]}
    if not finished:
        results["__child__"] = {"rc": rc, "stderr": err[-3000:]}
    return results


@pytest.fixture(scope="module")
def children(request, tmp_path_factory, start_py):
    """Starts every child the selected tests need, all at once; then collects them."""
    tmp = str(tmp_path_factory.mktemp("bad-input"))
    selected = {item.originalname for item in request.session.items
                if item.module is request.module}
    env_cases = _env_cases(tmp) if "test_environment_variable" in selected else []
    api_cases = (_api_cases() + FOREIGN_CASES
                 if selected & {"test_api_argument", "test_api_children_finished"} else [])

    # API tables: a few children, started first (they are the longest).
    runs = []
    for i in range(API_CHUNKS if api_cases else 0):
        chunk = api_cases[i::API_CHUNKS]
        payload = [(c[0], c[1], (c[2].get("check") if c[2]["kind"] == "ok" else None)) for c in chunk]
        code = API_RUNNER.replace("__CASES__", repr(payload))
        runs.append(([c[0] for c in chunk], start_py(code, env=_case_env({"FLAGOS_HOST_DEVICES": "2"}),
                                                     timeout=CHILD_TIMEOUT_S)))

    servers = []
    n_servers = max(1, min(4, os.cpu_count() or 1)) if env_cases else 0
    for i in range(n_servers):
        chunk = [(_env_key(p.values[0]), p.values[0]) for p in env_cases[i::n_servers]]
        cases_file = os.path.join(tmp, f"fork-server-{i}.json")
        with open(cases_file, "w") as f:
            json.dump(chunk, f)
        code = (FORK_SERVER.replace("__CASES_FILE__", repr(cases_file))
                .replace("__SNIPPET__", repr(CASE_SNIPPET))
                .replace("__TIMEOUT__", str(CASE_TIMEOUT_S)))
        env = _case_env({})
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        servers.append(start_py(code, env=env, timeout=CASE_TIMEOUT_S * len(chunk) + 60))

    api_results = {}
    for ids, proc in runs:
        api_results.update(_parse_api_output(ids, proc))
    env_results = {}
    for proc in servers:
        rc, out, err = proc.result()
        for line in out.splitlines():
            if line.startswith("CASE "):
                case = json.loads(line[5:])
                env_results[case["id"]] = case
        if "SERVER_DONE" not in out:
            env_results["__server__"] = {"rc": rc, "stderr": err[-3000:]}
    yield {"env": env_results, "api": api_results, "tmp": tmp}


def _check_exception(result, expect, where):
    assert "crash" not in result, f"{where}: {result['crash']}\n{result.get('stderr', '')}"
    assert not result["ok"], (f"{where}: expected {expect['types']} naming {expect['fragments']}, "
                              f"but it succeeded: {result.get('repr')}")
    types = set(result["mro"]) | {result["type"]}
    assert types & set(expect["types"]), (
        f"{where}: expected {expect['types']}, got {result['type']}: {result['msg'][:500]}")
    for fragment in expect["fragments"]:
        assert fragment in result["msg"], (
            f"{where}: the message does not name {fragment!r}: {result['type']}: {result['msg'][:500]}")


# ============================================================ the tests

@pytest.mark.parametrize("env,expect", _env_cases("<tmp>"))
def test_environment_variable(children, env, expect):
    # The table was built with a placeholder tmp dir for the ids; the fixture's
    # real one is substituted here.
    real_env = {k: v.replace("<tmp>", children["tmp"]) for k, v in env.items()}
    expect = json.loads(json.dumps(expect).replace("<tmp>", children["tmp"]))
    where = f"{' '.join(f'{k}={v[:60]!r}' for k, v in env.items())}"
    case = children["env"].get(_env_key(real_env))
    assert case is not None, f"{where}: no result (the fork server stopped: {children['env'].get('__server__')})"
    rc, out = case["rc"], case["out"]
    assert not case["hung"], f"{where}: no answer within {CASE_TIMEOUT_S}s (a hang)\n{out[-3000:]}"
    assert rc == 0, f"{where}: the process died with return code {rc} (a crash)\n{out[-3000:]}"
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"{where}: no result\n{out[-3000:]}"
    res = json.loads(lines[-1][7:])
    assert res.get("stage") != "import torch", f"{where}: `import torch` itself failed: {res}"
    var = next(iter(env))
    if var.startswith("FLAGOS_HOST_") and expect["kind"] != "raises" and torch_fl.driver() != "host":
        pytest.skip(f"{var}: a valid value takes effect on the host driver only")
    if expect["kind"] == "raises":
        assert res["stage"] == "import torch_fl", f"{where}: expected import torch_fl to raise, got {res}"
        _check_exception({"ok": False, **res}, expect, where)
        # The culprit: the variable's name, and its value (possibly abbreviated).
        name = var if not var.startswith("FLAGOS_OP_") else var[:60]
        assert name in res["msg"], f"{where}: the message does not name {name}: {res['msg'][:500]}"
        value = real_env[var]
        if value and not var.startswith("FLAGOS_OP_") or var == "FLAGOS_OP_mm":
            assert value[:40] in res["msg"], f"{where}: the message does not quote the value: {res['msg'][:500]}"
        # `import torch` survived the same mistake, turning it into a warning
        # (where torch_fl is installed, so that the entry point exists; an
        # in-tree build on PYTHONPATH, as on the GPU machine, has none).
        if _AUTOLOAD_INSTALLED:
            assert res["autoload_warning"], f"{where}: the torch.backends autoload did not warn"
    elif expect["kind"] == "op-raises":
        assert res["stage"] == "op", f"{where}: expected the first operation to raise, got {res}"
        _check_exception({"ok": False, **res}, expect, where)
    else:
        assert res["stage"] == "ok", f"{where}: expected a clean success, got {res}"
        assert res["value"] == [1.0, 3.0, 5.0, 7.0], res
        fields = expect["expect"]
        if "driver" in fields:
            assert res["driver"] == fields["driver"]
        if "devices" in fields:
            assert res["devices"] == fields["devices"]
        if "warning" in fields:
            assert any(fields["warning"] in w for w in res["warnings"]), res["warnings"]
        if "log_file" in fields:
            with open(fields["log_file"]) as f:
                assert "[flagos dispatch]" in f.read()


def _api_params():
    return [pytest.param(cid, code, expect, id=cid, marks=marks)
            for cid, code, expect, marks in _api_cases() + FOREIGN_CASES]


@pytest.mark.parametrize("case_id,code,expect", _api_params())
def test_api_argument(children, case_id, code, expect):
    result = children["api"].get(case_id)
    assert result is not None, f"{case_id}: no result"
    where = f"{case_id}: `{code[:200]}`"
    if expect["kind"] == "raises":
        _check_exception(result, expect, where)
    else:
        assert "crash" not in result, f"{where}: {result['crash']}\n{result.get('stderr', '')}"
        assert result["ok"], f"{where}: expected success, got {result['type']}: {result['msg'][:500]}"
        if expect["check"]:
            assert result["check"], f"{where}: wrong result: {result['repr']}"


def test_api_children_finished(children):
    """Every API child ran to its end (no crash, no hang, no failing cleanup)."""
    problems = {k: v for k, v in children["api"].items()
                if k == "__child__" or k.endswith("(cleanup)")}
    assert not problems, problems
