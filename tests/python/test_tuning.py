"""Tuning: torch_fl.tuning.tune() and `python -m torch_fl tune`.

Host driver (CI): the only backends are cpu and native, the same CPU kernels,
so the choices that matter are made between them and Python kernels the tests
register for the flaggems backend: a fast correct one, a fast wrong one and a
slow correct one. The Qwen3 tests tune a tiny random-weight model end to end.
GPU tests (marked cuda / flaggems) tune with FlagGems and CUDA available.
"""

import json
import os
import sys
import time

import pytest
import torch

import torch_fl
from torch_fl import _C

from conftest import python_kernels, PyProcess, start_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOAD = os.path.join(ROOT, "examples", "qwen3_workload.py")
DEV = "flagos"



@pytest.mark.host_only
def test_tune_picks_the_fastest_correct_backend(tmp_path):
    x = torch.rand(1 << 16) * 5 + 0.1
    lgamma_x = torch.lgamma(x)

    def fast_lgamma(t):  # correct for this workload's input, and far faster than the kernel
        return lgamma_x.clone()

    def fast_wrong_digamma(t):
        return t.clone()

    def slow_sigmoid(t):
        time.sleep(0.003)
        return torch.sigmoid(t)

    xd = x.to(DEV)
    # One intra-op thread: on a loaded CI machine, waking pool threads costs
    # whole scheduler slices, which would swamp the kernels' time.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with python_kernels({"lgamma": fast_lgamma, "digamma": fast_wrong_digamma,
                             "sigmoid": slow_sigmoid}):
            torch_fl.routing.set_route("lgamma", "native")
            with torch_fl.tuning.tune(budget_ms=3) as t:
                a = torch.lgamma(xd)
                b = torch.digamma(xd)
                c = torch.sigmoid(xd)
            conf = tmp_path / "tuned.conf"
            text = t.write_config(str(conf))
            assert torch_fl.routing.check_config(str(conf)) == []
    finally:
        torch.set_num_threads(threads)
    # The workload ran on its routes while tuning: native lgamma, the wrong digamma.
    torch.testing.assert_close(a.cpu(), lgamma_x)
    torch.testing.assert_close(b.cpu(), x)
    torch.testing.assert_close(c.cpu(), torch.sigmoid(x))

    d = {x.name: x for x in t.decisions}
    assert (d["lgamma"].chosen, d["lgamma"].current) == ("flaggems", "native"), d["lgamma"]
    assert d["lgamma"].per_call_us["flaggems"] < d["lgamma"].per_call_us["native"]
    assert d["digamma"].chosen == "native"
    assert d["digamma"].rejected["flaggems"].startswith("wrong on digamma(f32[65536])")
    assert d["digamma"].per_call_us.get("flaggems") is None
    assert (d["sigmoid"].chosen, d["sigmoid"].current) == ("native", "flaggems")
    assert d["sigmoid"].per_call_us["flaggems"] > 3000
    lines = {ln.split("=")[0].strip(): ln for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert lines["lgamma"].startswith("lgamma = flaggems") and "was native" in lines["lgamma"]
    assert "1 call, 1 signature; per call: flaggems" in lines["lgamma"]
    assert "flaggems rejected: wrong on digamma(f32[65536])" in lines["digamma"]
    assert lines["sigmoid"].startswith("sigmoid = native")


@pytest.mark.host_only
def test_tuning_does_not_disturb_rng_or_results():
    def work():
        torch.manual_seed(7)
        a = torch.randn(64, 32, device=DEV)
        d = torch.nn.functional.dropout(a, 0.5, training=True)
        b = (a @ a.T).softmax(-1)
        a.add_(b.sum(0)[:32])
        return a.cpu(), b.cpu(), d.cpu(), torch.rand(5, device=DEV).cpu(), torch.rand(3)

    want = work()
    with torch_fl.tuning.tune(budget_ms=1) as t:
        got = work()
    for w, g in zip(want, got):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
    sigs = t.data["signatures"]
    assert any(s["op"] == "aten::mm" and s["results"] for s in sigs)
    random = [s for s in sigs if s["skipped"].startswith("random")]
    assert random and all(not s["results"] for s in random)
    assert not _C._tuning()
    with pytest.raises(RuntimeError, match="already on"):
        with torch_fl.tuning.tune(), torch_fl.tuning.tune():
            pass
    assert not _C._tuning()


@pytest.mark.host_only
def test_signature_records_shapes_dtypes_strides_and_scalars():
    a = torch.randn(4, 6, device=DEV)
    with torch_fl.tuning.tune(budget_ms=0.5) as t:
        torch.add(a, a.T.T, alpha=2)
        a.T.softmax(-1)
        a.to(torch.bfloat16).sum(1, keepdim=True)
        torch.add(a, a, alpha=2)
    sigs = {s["signature"]: s for s in t.data["signatures"]}
    assert sigs["add.Tensor(f32[4, 6], f32[4, 6], alpha=2)"]["calls"] == 2
    assert "_softmax(f32[6, 4]{1, 6}, dim=-1, half_to_float=False)" in sigs
    assert any(s.startswith("sum.dim_IntList(bf16[4, 6], dim=[1], keepdim=True") for s in sigs)


# The workload: tiny Qwen3 inference, then training, in one process; saves the
# results and prints the routes it used.
WORK = """
import json, sys, torch
sys.path.insert(0, {examples!r})
import qwen3_workload as wl
res = {{m: wl.run("flagos", "tiny", "float32", m, batch=1, prompt_len=8, new_tokens=3, steps=2,
                  warmup=0) for m in ("infer", "train")}}
torch.save(res, {out!r})
import torch_fl
print("@@" + json.dumps([[r.op, r.source] for r in torch_fl.routing.table()]))
"""
KEYS = {"infer": ("tokens", "prefill_logits"), "train": ("losses", "grad_norms", "grads_last")}


def _work(tmp, name):
    out = os.path.join(tmp, f"{name}.pt")
    return WORK.format(examples=os.path.dirname(WORKLOAD), out=out), out


def _tune_cli(tmp, extra=()):
    conf, data = os.path.join(tmp, "tuned.conf"), os.path.join(tmp, "tune-data.json")
    code, out = _work(tmp, "during-tuning")
    args = ["-m", "torch_fl", "tune", "--out", conf, "--data", data, "--budget-ms", "1", *extra,
            "--", sys.executable, "-c", code]
    return PyProcess(args, None, 300), conf, data, out


def _same(a, b, keys):
    for k in keys:
        x, y = a[k], b[k]
        if isinstance(x, dict):
            assert x.keys() == y.keys()
            for n in x:
                torch.testing.assert_close(x[n], y[n], rtol=0, atol=0, msg=f"{k}[{n}]")
        elif isinstance(x, torch.Tensor):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=k)
        else:
            assert x == y, k


@pytest.mark.host_only
def test_cli_tunes_qwen3_and_the_config_is_used_with_equal_results(tmp_path):
    tmp = str(tmp_path)
    tune, conf, data, during_out = _tune_cli(tmp, ("--verify",))
    code, plain_out = _work(tmp, "plain")
    plain = start_py(code, timeout=300)
    rc, out, err = tune.result()
    assert rc == 0, out + err
    assert f"wrote {conf}" in out and "check-config: OK" in out, out
    assert "the same zero-copy CPU kernels" in out  # honest about the host driver
    assert torch_fl.routing.check_config(conf) == []
    entries = [ln for ln in open(conf).read().splitlines() if ln and not ln.startswith("#")]
    assert len(entries) >= 20, entries
    assert all(ln.split("#")[0].split("=")[1].strip() == "native" for ln in entries), entries
    assert all(" call" in ln and "per call:" in ln for ln in entries)
    d = json.load(open(data))
    assert d["kind"] == "tune" and d["signatures"] and d["decisions"]
    assert "flagos verify:" in err and "none diverges" in err  # --verify
    assert d["verify"]["records"] and not any(r["failed"] for r in d["verify"]["records"])

    code, tuned_out = _work(tmp, "tuned")
    tuned = start_py(code, env={"FLAGOS_BACKEND_CONFIG": conf}, timeout=300)
    results = {}
    for name, proc, path in (("plain", plain, plain_out), ("tuned", tuned, tuned_out)):
        rc, stdout, err = proc.result()
        assert rc == 0, stdout + err
        results[name] = torch.load(path, weights_only=False)
        if name == "tuned":
            routes = json.loads(stdout.split("@@", 1)[1])
            sources = [src for op, src in routes if src != "default"]
            assert len(sources) >= 20 and all(s.startswith(f"file {conf}:") for s in sources)
    during = torch.load(during_out, weights_only=False)
    for mode, keys in KEYS.items():
        _same(results["tuned"][mode], results["plain"][mode], keys)
        _same(during[mode], results["plain"][mode], keys)  # tuning did not disturb the run


def test_cli_errors(tmp_path, capsys):
    bad_env = start_py("import torch_fl", env={"FLAGOS_TUNE": str(tmp_path / "missing")})
    conf, data = str(tmp_path / "x.conf"), str(tmp_path / "x.json")

    def tune(command, out=conf):
        rc = torch_fl.tuning.run_cli(command, out, data, False, 1.0, 10)
        return rc, capsys.readouterr().err

    rc, err = tune([])
    assert rc == 2 and "no workload" in err
    rc, err = tune(["true"], out=str(tmp_path / "no" / "x.conf"))
    assert rc == 2 and "--out" in err and "cannot be written" in err
    rc, err = tune([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert rc == 3 and "exited with status 3; no config written" in err
    # A script, not -c: -c would put the working directory (a checkout whose
    # torch_fl/ has no built _C in CI) ahead of the installed package.
    idle = tmp_path / "idle.py"
    idle.write_text("import torch_fl\n")
    rc, err = tune([sys.executable, str(idle)])
    assert rc == 1 and "made no routed call" in err
    rc, err = tune([os.path.join(str(tmp_path), "no-such-program")])
    assert rc == 2 and "cannot run" in err
    assert not os.path.exists(conf) and not os.path.exists(data)
    rc, out, err = bad_env.result()
    assert rc != 0 and "FLAGOS_TUNE=" in err and "is not a directory" in err

    # Refused before the workload runs (it ran, then "left no tuning data").
    for budget, iters, words in ((-1.0, 10, "--budget-ms"), (float("nan"), 10, "--budget-ms"),
                                 (1.0, 0, "--max-iters")):
        rc = torch_fl.tuning.run_cli(["true"], conf, data, False, budget, iters)
        assert rc == 2 and words in capsys.readouterr().err
    rc, err = tune(["true"], out=data)  # the data file would overwrite the config
    assert rc == 2 and "--out and --data are one file" in err


def test_an_import_retried_after_the_tuner_refused_its_options_refuses_again(tmp_path):
    # The extension stays loaded after a failed import; the tuner was marked
    # started before it raised, so a second import succeeded and tuned nothing.
    (tmp_path / "options.json").write_text('{"budget_ms": -1}')
    code = (
        "import torch\n"
        "errors = []\n"
        "for _ in range(2):\n"
        "    try:\n"
        "        import torch_fl\n"
        "    except ValueError as e:\n"
        "        errors.append(str(e))\n"
        "print(len(errors))\n"
    )
    rc, out, err = start_py(code, env={"FLAGOS_TUNE": str(tmp_path)}).result()
    assert rc == 0 and out.strip().splitlines()[-1] == "2", (out, err)


# ---- GPU (the lead runs these on the H100) ------------------------------------------

@pytest.mark.cuda
def test_tune_times_cuda_backends_with_device_events():
    a = torch.randn(512, 512, device=DEV)
    b = torch.randn(512, 512, device=DEV)
    with torch_fl.tuning.tune(budget_ms=5) as t:
        (a @ b).softmax(-1).sum()
        torch.add(a, 1)
    rows = [s for s in t.data["signatures"] if s["results"]]
    assert rows
    for s in rows:
        timed = [r for r in s["results"] if r["status"] == "timed"]
        assert timed, s
        for r in timed:
            assert r["device_us"] > 0 and r["host_us"] > 0 and r["checked"], (s["signature"], r)
        names = {r["backend"] for r in s["results"]}
        assert "cuda" in names and "native" in names
        native = next(r for r in s["results"] if r["backend"] == "native")
        assert native["status"] == "same" and native["same_as"] == "cuda"
    mm = next(s for s in rows if s["op"] == "aten::mm")
    cpu = next((r for r in mm["results"] if r["backend"] == "cpu"), None)
    # Two distinct 1 MiB inputs (a @ a would be one storage, counted once): over the 1 MiB limit.
    assert cpu is not None and cpu["status"] == "not timed"
    d = {x.name: x for x in t.decisions}
    assert d["mm"].chosen in ("cuda", "flaggems", "native")


@pytest.mark.cuda
@pytest.mark.flaggems
def test_tune_qwen3_on_gpu_with_flaggems_and_cuda(tmp_path):
    if not torch_fl.is_flaggems_enabled():
        pytest.skip("FlagGems is not enabled")
    tmp = str(tmp_path)
    tune, conf, data, _ = _tune_cli(tmp)
    code, plain_out = _work(tmp, "plain")
    plain = start_py(code, timeout=300)
    rc, out, err = tune.result()
    assert rc == 0, out + err
    assert torch_fl.routing.check_config(conf) == []
    d = json.load(open(data))
    assert "flaggems" in d["backends"] and "cuda" in d["backends"]
    both = [s for s in d["signatures"]
            if {r["backend"] for r in s["results"] if r["status"] == "timed"} >= {"flaggems", "cuda"}]
    assert both, "no signature timed on both flaggems and cuda"
    chosen = {x["chosen"] for x in d["decisions"] if x["chosen"]}
    assert chosen and chosen <= {"flaggems", "cuda", "cpu", "native"}
    code, tuned_out = _work(tmp, "tuned")
    tuned = start_py(code, env={"FLAGOS_BACKEND_CONFIG": conf}, timeout=300)
    assert plain.result()[0] == 0 and tuned.result()[0] == 0
    a, b = torch.load(plain_out, weights_only=False), torch.load(tuned_out, weights_only=False)
    torch.testing.assert_close(b["infer"]["prefill_logits"], a["infer"]["prefill_logits"],
                               rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(torch.tensor(b["train"]["losses"]),
                               torch.tensor(a["train"]["losses"]), rtol=1e-3, atol=1e-3)


# ---- the decision rule, on made-up measurements ----------------------------------------

def _sig(op, signature, calls, route, **backends):
    results = []
    for b, v in backends.items():
        if v == "same":
            results.append(dict(backend=b, status="same", host_us=0, device_us=0, checked=True,
                                correct=True, problem="", note=""))
            continue
        host, device, correct = v
        results.append(dict(backend=b, status="timed", host_us=host, device_us=device,
                            checked=True, correct=correct, problem="" if correct else "differs",
                            note=""))
    return dict(op=op, signature=signature, calls=calls, route=route, routed=route, skipped="",
                results=results)


def _decide(*sigs):
    data = {"signatures": list(sigs)}
    for s in data["signatures"]:  # "same" rows carry their representative's figures
        for r in s["results"]:
            if r["status"] == "same":
                m = next(x for x in s["results"] if x["backend"] == "cuda")
                r.update(host_us=m["host_us"], device_us=m["device_us"])
    return {d.name: d for d in torch_fl.tuning.decide(data)}


def test_decide_weighs_host_time_margin_correctness_and_shapes():
    d = _decide(
        # FlagGems' kernel is faster on the device, but its host cost sets the pace.
        _sig("aten::add.Tensor", "add(a)", 100, "flaggems",
             flaggems=(40.0, 5.0, True), cuda=(8.0, 6.0, True), native="same"),
        # Within the 5% margin: the route in force stays.
        _sig("aten::mm", "mm(a)", 10, "flaggems",
             flaggems=(50.0, 100.0, True), cuda=(9.0, 97.0, True), native="same"),
        # Faster but wrong on one signature: rejected for the operator.
        _sig("aten::exp", "exp(a)", 5, "cuda", flaggems=(1.0, 1.0, True), cuda=(9.0, 9.0, True),
             native="same"),
        _sig("aten::exp", "exp(b)", 5, "cuda", flaggems=(1.0, 1.0, False), cuda=(9.0, 9.0, True),
             native="same"),
        # Shape-dependent: cuda wins the big signature, flaggems the small ones; by total time.
        _sig("aten::bmm", "bmm(small)", 100, "cuda", flaggems=(10.0, 2.0, True),
             cuda=(12.0, 3.0, True), native="same"),
        _sig("aten::bmm", "bmm(big)", 10, "cuda", flaggems=(20.0, 500.0, True),
             cuda=(12.0, 300.0, True), native="same"),
    )
    assert (d["add.Tensor"].chosen, d["add.Tensor"].current) == ("cuda", "flaggems")
    assert d["add.Tensor"].per_call_us == {"flaggems": 40.0, "cuda": 8.0, "native": 8.0}
    assert d["mm"].chosen == "flaggems"  # cuda saves 3%: not enough
    assert d["exp"].chosen == "cuda" and d["exp"].rejected["flaggems"].startswith("wrong on exp(b)")
    assert d["bmm"].chosen == "cuda"  # 100*12 + 10*300 < 100*10 + 10*500
    assert d["bmm"].note.startswith("speed depends on shape: cuda fastest on 1 signature(s)")
    assert "flaggems fastest on 1 signature(s)" in d["bmm"].note
    text = torch_fl.tuning.evidence(d["add.Tensor"])
    assert text.startswith("100 calls, 1 signature; per call: cuda 8 us (host 8 us, device 6 us)")
    assert "flaggems 40 us (host 40 us, device 5 us)" in text and text.endswith("was flaggems")
