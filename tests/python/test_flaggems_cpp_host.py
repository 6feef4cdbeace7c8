"""The C++ launch path of FlagGems kernels, what any machine can check (docs/flaggems_cpp.md).

- its knobs: FLAGGEMS_SOURCE_DIR (the spec's) names FlagGems' package
  directory, and a wrong value is an error naming the variable and what was
  expected; FLAGOS_FLAGGEMS_CPP and FLAGOS_FLAGGEMS_VERIFY take their listed
  values only;
- its op table covers what a Qwen3 forward and backward sends to FlagGems;
- the planners against FlagGems' own wrappers with no GPU
  (scripts/flaggems_offline_check.py): needs triton 3.6 and flag_gems, found
  in this interpreter or in FLAGOS_OFFLINE_PYTHON's; skipped otherwise (CI
  has neither) and on the cuda driver (the GPU tests check the real thing).
"""

import os
import subprocess
import sys

import pytest

import torch_fl
from conftest import start_py

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_wrong_flaggems_source_dir_is_an_error_naming_it(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    fake = tmp_path / "flag_gems"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    procs = {
        "missing": start_py("import torch_fl", env={"FLAGGEMS_SOURCE_DIR": str(tmp_path / "nope")}),
        "blank": start_py("import torch_fl", env={"FLAGGEMS_SOURCE_DIR": " "}),
        "empty": start_py("import torch_fl", env={"FLAGGEMS_SOURCE_DIR": str(empty)}),
        "no ops": start_py("import torch_fl", env={"FLAGGEMS_SOURCE_DIR": str(fake)}),
    }
    want = {"missing": "is not a directory", "blank": "is set but empty",
            "empty": "holds no flag_gems sources", "no ops": "holds no flag_gems sources"}
    for name, proc in procs.items():
        rc, out, err = proc.result()
        assert rc != 0, (name, out)
        assert "FLAGGEMS_SOURCE_DIR" in err and want[name] in err, (name, err[-2000:])
        assert "flag_gems.__file__" in err, err[-2000:]  # says how to find the right value


def test_a_flaggems_source_checkout_is_accepted(tmp_path):
    pkg = tmp_path / "src" / "flag_gems"
    (pkg / "ops").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    rc, out, err = start_py("import torch_fl._flaggems_cpp as m; print(m.source_dir())",
                            env={"FLAGGEMS_SOURCE_DIR": str(tmp_path)}).result()
    assert rc == 0, err
    assert out.strip() == str(pkg)


@pytest.mark.parametrize("var,value", [("FLAGOS_FLAGGEMS_CPP", "2"), ("FLAGOS_FLAGGEMS_VERIFY", "all")])
def test_bad_cpp_knobs_are_errors(var, value):
    rc, out, err = start_py("import torch_fl", env={var: value}).result()
    assert rc != 0
    assert f"{var}='{value}' is not valid" in err, err[-2000:]


def test_op_table_covers_the_qwen3_operators():
    described = set(torch_fl._C._flaggems_all_described_ops())
    # What a Qwen3 generate + training step sends to FlagGems (flag-gems 5.0.2,
    # default routing, docs/flaggems_cpp.md).
    qwen3 = {"add.Tensor", "add_.Tensor", "sub.Tensor", "neg", "rsqrt", "silu", "cos", "sin",
             "div.Tensor", "div_.Tensor", "lerp_.Scalar", "eq.Scalar", "ne.Scalar", "where.self",
             "mul_.Tensor", "zero_", "mean.dim", "argmax", "all", "_softmax",
             "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data", "cat",
             "index_select", "embedding_dense_backward", "nll_loss_forward", "bmm", "addmm",
             "cumsum"}
    assert qwen3 <= described, sorted(qwen3 - described)
    import torch

    for name in described:
        base, _, overload = name.partition(".")
        assert overload in getattr(torch.ops.aten, base).overloads() or not overload, name


def test_flaggems_calls_sums_both_paths():
    calls = {"flaggems": 5, "flaggems-python": 2, "native": 7}
    assert torch_fl.routing.flaggems_calls(calls) == 7


def _offline_python():
    exe = os.environ.get("FLAGOS_OFFLINE_PYTHON", sys.executable)
    probe = ("import importlib.util as u, os, sys; "
             "ok = u.find_spec('triton') and (u.find_spec('flag_gems') or os.environ.get('FLAGGEMS_SOURCE_DIR')); "
             "import triton; print(triton.__version__ if ok else '')")
    try:
        out = subprocess.run([exe, "-c", probe], capture_output=True, text=True, timeout=120).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return exe if out.startswith("3.6") else None


@pytest.mark.slow
def test_planners_match_flaggems_wrappers_offline():
    if torch_fl.driver() == "cuda":
        pytest.skip("the GPU tests check the C++ path itself (test_flaggems_cpp.py)")
    exe = _offline_python()
    if exe is None:
        pytest.skip("needs triton 3.6 and flag_gems (here or in FLAGOS_OFFLINE_PYTHON's interpreter)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p)
    p = subprocess.run([exe, "-W", "ignore", os.path.join(ROOT, "scripts", "flaggems_offline_check.py"),
                        "--cases", "60", "--compile"], capture_output=True, text=True, env=env,
                       timeout=1200)
    tail = "\n".join(p.stdout.splitlines()[-20:])
    assert p.returncode == 0, f"{tail}\n{p.stderr[-3000:]}"
    assert " 0 mismatches" in p.stdout, tail


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--stub-only"]], ids=["default", "stub-only"])
def test_online_flow_dry_run(tmp_path, mode):
    """Routing -> capture -> admission -> disk cache -> launch from C++, with nothing launched."""
    if torch_fl.driver() == "cuda":
        pytest.skip("the GPU tests run the real thing (test_flaggems_cpp.py)")
    exe = _offline_python()
    if exe is None:
        pytest.skip("needs triton 3.6 and flag_gems (here or in FLAGOS_OFFLINE_PYTHON's interpreter)")
    env = dict(os.environ, FLAGOS_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = os.pathsep.join(p for p in [ROOT, env.get("PYTHONPATH", "")] if p)
    cmd = [exe, "-W", "ignore", os.path.join(ROOT, "scripts", "flaggems_offline_check.py"), "--online", *mode]
    for run in ("cold", "warm"):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert p.returncode == 0 and "online flow: OK" in p.stdout, f"{run}\n{p.stdout}\n{p.stderr[-3000:]}"
    if not mode:
        assert "captures 0, admitted 0" in p.stdout, p.stdout  # warm: every kernel from disk
