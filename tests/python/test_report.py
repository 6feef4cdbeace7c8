"""The routing report: FLAGOS_REPORT data, tune data, HTML and Markdown with the plot."""

import base64
import json
import os
import re

import pytest
import torch

import torch_fl

DEV = "flagos"

# A run with a CPU fallback (tanh routed to cuda, which the host driver lacks),
# a deliberately wrong kernel caught by verification (sigmoid), and host times.
RUN = """
import torch, torch_fl
from torch_fl import _C
_C._register_python_kernel('sigmoid', lambda x: torch.sigmoid(x) * 2)
torch_fl.routing.reload()
x = torch.randn(32, 32, device='flagos')
for _ in range(3):
    y = torch.tanh(x @ x).sigmoid().sum()
print(float(y))
"""


def _png_of(text: str) -> bytes:
    m = re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text)
    assert m, "no embedded PNG"
    png = base64.b64decode(m.group(1))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    return png


@pytest.mark.host_only
def test_report_of_a_run_shows_fallbacks_verification_and_times(tmp_path, run_py):
    data = tmp_path / "run-3.json"
    rc, out, err = run_py(RUN, env={"FLAGOS_REPORT": str(tmp_path / "run-{rank}.json"), "RANK": "3",
                                    "FLAGOS_VERIFY": "1",
                                    "FLAGOS_OP_tanh": "cuda", "FLAGOS_CONFIG_STRICT": "0",
                                    "FLAGOS_CPU_FALLBACK": "allow"})
    assert rc == 0, err
    d = json.loads(data.read_text())
    assert d["kind"] == "run" and d["profile"] and d["verify"]["records"]
    assert {s["op"]: s["cpu_fallbacks"] for s in d["stats"]}["aten::tanh"] == 3
    html_path = torch_fl.report.build(str(data), str(tmp_path / "r.html"))
    md_path = torch_fl.report.build(str(data), str(tmp_path / "r.md"))
    html = open(html_path).read()
    md = open(md_path).read()
    for text in (html, md):
        _png_of(text)
        assert "CPU fallbacks" in text and "tanh: 3 calls" in text
        assert "Diverging operators" in text and "DIVERGES on flaggems: 3/3 calls" in text
        assert "mm" in text and "host, total" in text
    assert html.startswith("<!DOCTYPE html>") and "<table>" in html
    assert md.startswith("# torch_fl routing report") and "| operator |" in md


@pytest.mark.host_only
def test_report_of_tune_data_shows_chosen_routes(tmp_path, run_py):
    a = torch.randn(16, 16, device=DEV)
    with torch_fl.tuning.tune(budget_ms=0.5) as t:
        (a @ a).relu().sum()
    data = tmp_path / "tune-data.json"
    t.save(str(data))
    out = tmp_path / "report.md"
    rc, stdout, err = run_py("import sys; from torch_fl.__main__ import main; "
                             f"sys.exit(main(['report', '--from', {str(data)!r}, '--out', "
                             f"{str(out)!r}]))")
    assert rc == 0, err
    text = out.read_text()
    _png_of(text)
    assert "(tuning)" in text and "tuning, per call" in text and "the same zero-copy CPU kernels" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| mm |"))
    assert "native" in row and "us/call" in row


def test_report_errors(tmp_path, start_py, capsys):
    # Without matplotlib: a clear message naming the package and the pinned version.
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "import torch_fl\n"
            f"torch_fl.report.build(torch_fl.report.collect(), {str(tmp_path / 'r.html')!r})")
    no_mpl = start_py(code)
    bad_env = start_py("import torch_fl", env={"FLAGOS_REPORT": str(tmp_path / "no" / "x.json")})
    from torch_fl.__main__ import main

    assert main(["report", "--from", str(tmp_path / "none.json")]) == 1
    err = capsys.readouterr().err
    assert "no data file" in err and "FLAGOS_REPORT" in err
    # A directory, not a file: an error line, not a traceback.
    assert main(["report", "--from", str(tmp_path)]) == 1
    assert "report:" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a torch_fl data file"):
        torch_fl.report.build(str(bad), str(tmp_path / "r.html"))
    with pytest.raises(ValueError, match="name it .html or .md"):
        torch_fl.report.build(torch_fl.report.collect(), str(tmp_path / "r.pdf"))
    rc, out, err = no_mpl.result()
    assert rc != 0 and "needs matplotlib" in err and "pip install matplotlib==3.10.9" in err
    rc, out, err = bad_env.result()
    assert rc != 0 and "FLAGOS_REPORT=" in err and "cannot be written" in err
    assert not os.path.exists(tmp_path / "r.html")


def test_plot_has_a_colour_for_both_flaggems_call_keys():
    # The calls plot draws only the backends in COLORS: calls under a key
    # without a colour would count in the totals but never be drawn.
    assert set(torch_fl.routing.FLAGGEMS_KEYS) <= set(torch_fl.report.COLORS)


def test_merge_keeps_a_later_parts_failure_and_leaves_the_parts_alone():
    from torch_fl import _rundata

    def part(pid, calls, failed, first="", skip=""):
        rec = {"op": "aten::mm", "backend": "flaggems", "compared": 2, "failed": failed,
               "skipped": 0, "max_abs": float(failed), "max_rel": 0.0,
               "first_failure_call": first and "mm(f32[2,2])", "first_failure": first,
               "skip_reason": skip}
        return {"pid": pid, "signatures": [], "profile": [], "verify": {"records": [rec]},
                "stats": [{"op": "aten::mm", "calls": {"flaggems": calls}, "cpu_fallbacks": 0}]}

    parts = [part(1, 3, 0), part(2, 4, 1, "max abs 1", "random")]
    out = _rundata.merge(parts)
    (rec,) = out["verify"]["records"]
    assert rec["failed"] == 1 and rec["first_failure"] == "max abs 1"
    assert rec["first_failure_call"] == "mm(f32[2,2])" and rec["skip_reason"] == "random"
    assert out["stats"][0]["calls"] == {"flaggems": 7}
    assert parts[0]["stats"][0]["calls"] == {"flaggems": 3}
    assert parts[0]["verify"]["records"][0]["failed"] == 0


def test_flagos_report_writes_through_links_and_fifos_and_checks_at_start(tmp_path, run_py):
    # The data file was written beside the path and renamed over it: a FIFO,
    # a device (/dev/stdout) or a symlink became a regular file, and a path
    # that cannot be written failed at exit with the data lost.
    import threading

    work = "import torch, torch_fl; (torch.ones(3, device='flagos') * 2).sum()"
    target = tmp_path / "target.json"
    target.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    rc, out, err = run_py(work, env={"FLAGOS_REPORT": str(link)})
    assert rc == 0, err
    assert link.is_symlink() and json.loads(target.read_text())["format"] == "torch_fl-run-data"

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(open(fifo).read()))
    reader.start()
    rc, out, err = run_py(work, env={"FLAGOS_REPORT": str(fifo)})
    reader.join(timeout=60)
    assert rc == 0, err
    assert fifo.is_fifo() and json.loads(received[0])["format"] == "torch_fl-run-data"

    rc, out, err = run_py(work, env={"FLAGOS_REPORT": "/proc/run.json"})
    assert rc != 0 and "FLAGOS_REPORT='/proc/run.json' cannot be written" in err, err
