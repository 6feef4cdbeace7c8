"""When ``import torch`` registers flagos (torch_fl_autoload.py, docs/gpu.md).

The torch.backends entry point registers flagos only where no other
accelerator is built into torch, unless FLAGOS_AUTOLOAD says otherwise:
registering a PrivateUse1 backend breaks the autograd of every other
accelerator in that process (a PyTorch limitation). A fresh process runs the
entry point, as ``import torch`` does, once per case; a "torch built with
CUDA" is simulated here by making
torch.accelerator.current_accelerator() answer cuda, and a CPU build by making
it answer None, so the cases hold on any machine (the GPU suite's
test_coexistence.py runs the CUDA build for real).
"""

import json

import pytest

CASES = {
    # id: (FLAGOS_AUTOLOAD, torch built with, registered at `import torch`, warning fragment)
    "auto-cuda-torch": (None, "cuda", False, None),
    "auto-mps-torch": (None, "mps", False, None),
    "0-cpu-torch": ("0", None, False, None),
    "empty": ("", None, False, "FLAGOS_AUTOLOAD=''"),
    "garbage": ("bogus!", None, False, "FLAGOS_AUTOLOAD='bogus!'"),
    "negative": ("-1", "cuda", False, "FLAGOS_AUTOLOAD='-1'"),
    "huge-text": ("x" * 10000, None, False, "FLAGOS_AUTOLOAD='xxxxxxxxxx"),
    "1-cuda-torch": ("1", "cuda", True, None),
    "explicit-auto": ("auto", None, True, None),
    "auto-cpu-torch": (None, None, True, None),  # last: this one really registers
}

# One process runs the entry point (what `import torch` runs) once per case,
# the cases that leave flagos unregistered first; the cases that register are
# asked for the decision, and the last one registers for real.
CHILD = r"""
import json, os, sys, warnings
import torch
import torch_fl_autoload

def state():
    try:
        torch.zeros(1, device="flagos")
        parses = True
    except RuntimeError:
        parses = False
    return {"loaded": "torch_fl" in sys.modules, "name": torch._C._get_privateuse1_backend_name(),
            "flagos_parses": parses}

out = {}
cases = __CASES__
for i, (case_id, (value, built_with, registers, _)) in enumerate(cases.items()):
    os.environ.pop("FLAGOS_AUTOLOAD", None)
    if value is not None:
        os.environ["FLAGOS_AUTOLOAD"] = value
    torch.accelerator.current_accelerator = (
        lambda check_available=False, b=built_with: None if b is None else torch.device(b))
    if registers and i != len(cases) - 1:
        out[case_id] = {"decision": torch_fl_autoload.decision()[0]}
        continue
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch_fl_autoload.load()
    out[case_id] = {**state(), "warnings": [str(w.message) for w in caught]}
import torch_fl
out["after_import"] = (torch.arange(3.0, device="flagos") * 2).cpu().tolist()
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def results(run_py):
    rc, stdout, stderr = run_py(CHILD.replace("__CASES__", repr(CASES)),
                                env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FLAGOS_AUTOLOAD": None})
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert rc == 0 and lines, stderr[-3000:]
    return json.loads(lines[-1][7:])


@pytest.mark.parametrize("case_id", list(CASES))
def test_entry_point_registers_flagos_only_where_it_harms_no_accelerator(results, case_id):
    _, _, registers, warning = CASES[case_id]
    res = results[case_id]
    if "decision" in res:
        assert res["decision"] is registers, res
        return
    assert res["loaded"] == registers, res
    assert res["name"] == ("flagos" if registers else "privateuseone"), res
    assert res["flagos_parses"] == registers, res
    if warning is None:
        assert not [w for w in res["warnings"] if "FLAGOS_AUTOLOAD" in w], res["warnings"]
    else:
        (message,) = [w for w in res["warnings"] if "FLAGOS_AUTOLOAD" in w]
        assert warning in message and "auto (the default), 1 or 0" in message, message
        assert len(message) < 300, "the value is abbreviated"


def test_import_torch_fl_registers_whatever_the_autoload_did(results):
    assert results["after_import"] == [0.0, 2.0, 4.0]


def test_decision_names_its_reason(monkeypatch):
    import torch

    import torch_fl_autoload

    monkeypatch.setenv("FLAGOS_AUTOLOAD", "auto")
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: torch.device("cuda"))
    register, reason = torch_fl_autoload.decision()
    assert not register and "cuda" in reason and "import torch_fl" in reason
    monkeypatch.setenv("FLAGOS_AUTOLOAD", "nope")
    with pytest.raises(ValueError, match="FLAGOS_AUTOLOAD='nope'"):
        torch_fl_autoload.decision()
