"""Qwen3 end to end on flagos, compared with a reference device.

Every run, on flagos and on the reference, is a child process of the workload
program (examples/qwen3_workload.py), each with its own routing
(FLAGOS_BACKEND_CONFIG); the results are compared here:

- host driver (`host_only`): the `tiny` model, reference cpu, routings
  default, all-cpu and mixed;
- cuda driver (`cuda`): the `0.6b` model (Qwen3-0.6B's shape), reference
  native CUDA in a process that never loads torch_fl
  (TORCH_DEVICE_BACKEND_AUTOLOAD=0: CUDA backward fails once PrivateUse1 is
  registered, pytorch/pytorch#161129), routings default (FlagGems, `flaggems`:
  its kernels launched from C++ where described, docs/flaggems_cpp.md),
  stub-only (FLAGOS_DISABLE_FLAGGEMS_PY=1: only the C++-launched FlagGems
  kernels, the rest native), all-cuda and mixed.

For each routing: float32 greedy tokens equal to the reference's, bfloat16
prefill logits close (token agreement reported), 10 float32 AdamW steps with
losses, gradient norms and full gradients close, and the routing statistics
showing that the routing took effect. Observed differences are printed to the
terminal, also for passing tests. Each run happens once per session; runs
start in parallel when the module's first test needs one.
"""

import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import torch_fl
from conftest import _child_env

pytest.importorskip("transformers")

WORKLOAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "qwen3_workload.py")
WORKLOAD = os.path.normpath(WORKLOAD)
sys.path.insert(0, os.path.dirname(WORKLOAD))
import qwen3_workload  # noqa: E402

# Every test here compares child processes; the parent uses one device at most.
USES_DEVICES_IN_CHILDREN_ONLY = True

ON_CUDA = torch_fl.driver() == "cuda"

# --- the runs -----------------------------------------------------------------

HOST = dict(size="tiny", reference="cpu", batch=2, prompt_len=16, new_tokens=12, steps=10,
            timeout=300, parallel=max(1, min(4, os.cpu_count() or 1)))
CUDA = dict(size="0.6b", reference="cuda", batch=2, prompt_len=32, new_tokens=24, steps=10,
            timeout=1800, parallel=int(os.environ.get("FLAGOS_QWEN3_PARALLEL", "2")))

# Operators the host's mixed routing sends to `cpu`; every other one runs on
# `native`. On the host driver both are PyTorch's CPU kernels, so results stay
# bit for bit; what is checked is that each route was taken.
HOST_MIXED_CPU = ("mm", "bmm", "silu", "silu_backward", "rsqrt", "_log_softmax",
                  "_log_softmax_backward_data", "embedding_dense_backward")
# The cuda driver's mixed routing: FlagGems where it serves an operator, else
# `cuda` (`* = flaggems, cuda`), except these GEMMs, on `cuda`.
CUDA_MIXED_CUDA = ("mm", "bmm", "addmm")

ROUTINGS = {
    "host": {
        "default": None,  # the packaged config: native everywhere on this driver
        "all_cpu": "* = cpu\n",
        "mixed": "* = native\n" + "".join(f"{op} = cpu\n" for op in HOST_MIXED_CPU),
    },
    "cuda": {
        "default": None,  # FlagGems where it serves the op, else native
        "stub_only": None,  # the same, FLAGOS_DISABLE_FLAGGEMS_PY=1 (C++-launched FlagGems only)
        "all_cuda": "* = cuda\n",
        "mixed": "* = flaggems, cuda\n" + "".join(f"{op} = cuda\n" for op in CUDA_MIXED_CUDA),
    },
}

# --- tolerances -----------------------------------------------------------------
# One place; tune after GPU data (every comparison prints what it observed).
# Keys: (driver, routing kind); "same" = the same kernels as the reference.
#   logits: torch.testing.assert_close on the prefill logits (rtol, atol), and
#           a bound on the mean |diff| (robust to a few outliers);
#   loss/norm: relative tolerance on per-step losses and per-parameter gradient norms;
#   grad: per-parameter relative L2 error ||g - g_ref|| / ||g_ref|| at the first
#         and last step (elementwise checks on gradients are dominated by
#         entries near zero);
#   margin: float32 greedy tokens may part from the reference only where the
#           reference's top-1/top-2 logit margin is below this (a near tie that
#           any rounding difference can flip); "same" kernels allow no parting.
TOL = {
    # Host driver: flagos memory is host memory and both the `cpu` and the
    # `native` backends run PyTorch's CPU kernels, so results are bit for bit
    # equal. 1e-6 (not 0) only absorbs a BLAS choosing another code path for
    # another buffer alignment. bfloat16: a couple of bf16 ulps (2**-8 relative).
    ("host", "same"): dict(
        logits={torch.float32: (1e-6, 1e-6, 1e-7), torch.bfloat16: (1e-2, 1e-2, 1e-3)},
        loss=1e-6, norm=1e-6, grad_first=1e-6, grad_last=1e-6, margin=0.0),
    # all-cuda against native CUDA: the same CUDA kernels on the same inputs
    # (SDPA included: flagos picks the fused kernel CUDA picks), so ~1e-6.
    ("cuda", "same"): dict(
        logits={torch.float32: (1e-6, 1e-6, 1e-7), torch.bfloat16: (1e-6, 1e-6, 1e-7)},
        loss=1e-6, norm=1e-6, grad_first=1e-6, grad_last=1e-6, margin=0.0),
    # FlagGems kernels (default and mixed routings): other accumulation orders
    # and fused formulas. float32 ops agree to a few ulps (FlagGems' kernels use
    # no TF32), which 28 layers grow to ~1e-5 relative in the logits (measured
    # on an H100: max 3.5e-5, mean 3.9e-6). bfloat16: a bf16 ulp at the logits'
    # scale (4..8) is 0.016..0.03 and the differences compound through 28
    # layers (measured: max 0.27, mean 0.028). Training: the first step's loss
    # and gradients agree to float32 rounding (measured 6e-6 relative); AdamW's
    # normalised update (m / sqrt(v)) turns rounding-size differences in small
    # gradient entries into lr-size parameter differences, so over 10 steps the
    # losses part by up to ~1e-3 relative (measured 6.5e-4) and the gradients
    # by ~3e-3 (measured 2.6e-3; all-cuda: exactly 0, so this is FlagGems'
    # rounding and nothing else).
    ("cuda", "flaggems"): dict(
        logits={torch.float32: (1e-4, 1e-4, 3e-5), torch.bfloat16: (5e-2, 5e-1, 5e-2)},
        loss_first=1e-5, loss=2e-3, norm=5e-3, grad_first=1e-4, grad_last=1e-2, margin=1e-3),
}


def tolerance(driver: str, routing: str) -> dict:
    if driver == "host" or routing == "all_cuda":
        return TOL[(driver, "same")]
    return TOL[(driver, "flaggems")]


# --- running the workload -------------------------------------------------------

def _plan(test: str):
    """(mode, dtype) of the flagos run that ``test`` compares with the reference."""
    if "inference_fp32" in test:
        return "infer", "float32"
    if "inference_bf16" in test:
        return "infer", "bfloat16"
    if "training" in test:
        return "train", "float32"
    return None


class Runs:
    """Workload runs by key (device, routing, mode, dtype); each runs once, in a
    child process, with at most ``parallel`` at a time."""

    def __init__(self, driver: str, workdir: str):
        self.driver = driver
        self.cfg = HOST if driver == "host" else CUDA
        self.workdir = workdir
        self._pool = ThreadPoolExecutor(self.cfg["parallel"])
        self._futures = {}
        self._lock = threading.Lock()
        self._configs = {}
        for name, text in ROUTINGS[driver].items():
            if text is not None:
                path = os.path.join(workdir, f"{name}.conf")
                with open(path, "w") as f:
                    f.write(text)
                self._configs[name] = path

    def _command(self, key):
        device, routing, mode, dtype = key
        c = self.cfg
        out = os.path.join(self.workdir, "-".join(str(k) for k in key) + ".pt")
        args = [sys.executable, WORKLOAD, "--device", device, "--size", c["size"], "--mode", mode,
                "--dtype", dtype, "--batch", str(c["batch"]), "--prompt-len", str(c["prompt_len"]),
                "--new-tokens", str(c["new_tokens"]), "--steps", str(c["steps"]), "--warmup", "0",
                "--out", out]
        if device == "flagos":
            env = {"FLAGOS_BACKEND_CONFIG": self._configs.get(routing), "TORCH_DEVICE_BACKEND_AUTOLOAD": None,
                   "FLAGOS_DISABLE_FLAGGEMS_PY": "1" if routing == "stub_only" else None}
        else:
            # The reference never loads torch_fl. On cuda its SDPA makes CUDA's
            # own choice, the kernel flagos' SDPA picks too (csrc/aten/attention.cpp).
            env = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "FLAGOS_BACKEND_CONFIG": None}
        return args, env, out

    def _run(self, key):
        args, env, out = self._command(key)
        try:
            p = subprocess.run(args, env=_child_env(env), cwd=tempfile.gettempdir(), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=self.cfg["timeout"])
        except subprocess.TimeoutExpired as e:
            return AssertionError(f"{key}: timed out after {self.cfg['timeout']} s\n{e.stdout}\n{e.stderr}")
        if p.returncode != 0:
            return AssertionError(f"{key}: exit {p.returncode}\n{' '.join(args)}\n{p.stdout}\n{p.stderr[-6000:]}")
        return torch.load(out, weights_only=True)

    def start(self, key):
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(self._run, key)

    def get(self, key):
        self.start(key)
        result = self._futures[key].result()
        if isinstance(result, Exception):
            raise result
        return result

    def close(self):
        self._pool.shutdown(wait=True, cancel_futures=True)


def _skipped(item) -> bool:
    if item.get_closest_marker("skip") is not None:
        return True
    return any(m.args and m.args[0] for m in item.iter_markers("skipif"))


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The module's runs; every run a selected, unskipped test needs starts now."""
    driver = "cuda" if ON_CUDA else "host"
    r = Runs(driver, str(tmp_path_factory.mktemp("qwen3")))
    ref = (HOST if driver == "host" else CUDA)["reference"]
    keys = []
    for item in request.session.items:
        if item.module is not request.module or _skipped(item) or not hasattr(item, "callspec"):
            continue
        if not item.originalname.startswith(f"test_{driver}_"):
            continue
        plan = _plan(item.originalname)
        if plan:
            keys += [(ref, None, *plan), ("flagos", item.callspec.params["routing"], *plan)]
    # References first: every test needs one.
    for key in sorted(set(keys), key=lambda k: (k[0] == "flagos", keys.index(k))):
        r.start(key)
    yield r
    r.close()


@pytest.fixture
def report(capsys):
    """Prints to the terminal past pytest's capture, so logs show observed differences."""
    def write(msg):
        with capsys.disabled():
            print(f"\n[qwen3] {msg}", end="")
    return write


# --- comparisons ----------------------------------------------------------------

def _base(op: str) -> tuple:
    name = op.split("::")[-1]
    return name, name.split(".")[0]


FLAGGEMS = set(torch_fl.routing.FLAGGEMS_KEYS)  # launched from C++, or by FlagGems' wrapper


def expected_backends(driver: str, routing: str, op: str, summary: dict) -> set:
    """The backends ``op`` may run on. A FlagGems operator also runs `native`
    for calls with a 0-dim or empty tensor, which flaggems declines (and, in
    stub-only mode, for arguments its C++ planner does not serve)."""
    name, base = _base(op)
    gems = FLAGGEMS | {"native"} if name in summary["flaggems_ops"] else None
    if routing == "default":
        return gems or {"native"}
    if routing == "stub_only":
        return {"flaggems", "native"} if gems else {"native"}
    if routing == "all_cpu":
        return {"cpu"}
    if routing == "all_cuda":
        return {"cuda"}
    if driver == "host":  # mixed
        return {"cpu"} if base in HOST_MIXED_CPU else {"native"}
    return {"cuda"} if base in CUDA_MIXED_CUDA else (gems or {"cuda"})


def check_routing(result: dict, driver: str, routing: str, report) -> None:
    """Every operator ran on the backend the routing names, and nothing fell back to the CPU."""
    summary = result["routing"]
    assert summary["driver"] == driver
    stats = summary["stats"]
    assert stats, "no routed operator was counted"
    wrong, fallbacks, per = [], [], {}
    for s in stats:
        want = expected_backends(driver, routing, s["op"], summary)
        if not set(s["calls"]) <= want:
            wrong.append(f"{s['op']}: {s['calls']} (expected {want})")
        if s["cpu_fallbacks"]:
            fallbacks.append(f"{s['op']}: {s['cpu_fallbacks']}")
        for b, n in s["calls"].items():
            per[b] = per.get(b, 0) + n
    report(f"routing {routing}: calls per backend {per}")
    cpp = summary.get("flaggems_cpp")
    if cpp:
        report(f"routing {routing}: FlagGems from C++: launched {cpp['launched']}, captures "
               f"{cpp['captures']}, admitted {cpp['admitted']}, pinned {cpp['pinned'][:5]}")
    assert not fallbacks, f"CPU fallbacks: {fallbacks}"
    assert not wrong, "operators on the wrong backend:\n  " + "\n  ".join(wrong)
    if driver == "cuda" and routing in ("default", "stub_only") and cpp:
        assert per.get("flaggems", 0) > 0, f"no FlagGems kernel was launched from C++: {per}"
    if routing == "mixed" or (routing in ("default", "stub_only") and driver == "cuda"):
        # Mixed means mixed: both kinds of backend were used.
        assert len(per) >= (2 if summary["flaggems_enabled"] or driver == "host" else 1), per


def compare_logits(got, ref, dtype, tol, report, what):
    rtol, atol, mean_tol = tol["logits"][dtype]
    d = (got - ref).abs()
    report(f"{what}: prefill logits max |diff| {d.max().item():.3e}, mean {d.mean().item():.3e} "
           f"(|ref| max {ref.abs().max().item():.2f}; rtol {rtol}, atol {atol}, mean <= {mean_tol})")
    assert d.mean().item() <= mean_tol, f"{what}: mean |logit diff| {d.mean().item():.3e} > {mean_tol}"
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check_tokens(got, ref, tol, report, what, strict=True):
    """Greedy tokens equal; where they part (float32 only), only at a near tie."""
    a = qwen3_workload.agreement(got, ref)
    report(f"{what}: tokens equal {a['tokens_equal']}/{a['tokens_total']}, first divergences "
           f"{a['first_divergence']}")
    if not strict:
        return a
    for d in a["first_divergence"]:
        assert d["ref_margin"] < tol["margin"], (
            f"{what}: sequence {d['seq']} parts from the reference at token {d['pos']}, where the "
            f"reference's top-1/top-2 margin is {d['ref_margin']:.3e} (not a near tie; allowed "
            f"below {tol['margin']})\nflagos {got['tokens'][d['seq']].tolist()}\n"
            f"ref    {ref['tokens'][d['seq']].tolist()}")
    return a


def check_reference(ref: dict, device: str) -> None:
    assert ref["meta"]["device"] == device
    assert not ref["torch_fl_loaded"], "the reference process loaded torch_fl"


def run_inference(runs, driver, routing, dtype_name, report):
    ref_dev = runs.cfg["reference"]
    ref = runs.get((ref_dev, None, "infer", dtype_name))
    got = runs.get(("flagos", routing, "infer", dtype_name))
    check_reference(ref, ref_dev)
    tol = tolerance(driver, routing)
    dtype = qwen3_workload.DTYPES[dtype_name]
    what = f"{driver}/{routing} {dtype_name}"
    assert got["tokens"].shape == ref["tokens"].shape
    compare_logits(got["prefill_logits"], ref["prefill_logits"], dtype, tol, report, what)
    check_tokens(got, ref, tol, report, what, strict=dtype == torch.float32)
    check_routing(got, driver, routing, report)
    return got, ref


def run_training(runs, driver, routing, report):
    ref_dev = runs.cfg["reference"]
    ref = runs.get((ref_dev, None, "train", "float32"))
    got = runs.get(("flagos", routing, "train", "float32"))
    check_reference(ref, ref_dev)
    tol = tolerance(driver, routing)
    what = f"{driver}/{routing} training"
    losses, ref_losses = torch.tensor(got["losses"]), torch.tensor(ref["losses"])
    loss_rel = ((losses - ref_losses).abs() / ref_losses.abs()).max().item()
    assert got["param_names"] == ref["param_names"]
    norms, ref_norms = got["grad_norms"], ref["grad_norms"]
    norm_rel = ((norms - ref_norms).abs() / ref_norms.abs().clamp_min(1e-30)).max().item()
    grad_rel = {}
    for which in ("grads_first", "grads_last"):
        assert got[which].keys() == ref[which].keys() and ref[which]
        errs = {n: ((got[which][n] - g).norm() / g.norm().clamp_min(1e-30)).item()
                for n, g in ref[which].items()}
        worst = max(errs, key=errs.get)
        grad_rel[which] = (errs[worst], worst)
    report(f"{what}: losses flagos {[round(x, 5) for x in got['losses']]}")
    report(f"{what}: losses ref    {[round(x, 5) for x in ref['losses']]}")
    report(f"{what}: max rel diff: loss {loss_rel:.3e}, grad norm {norm_rel:.3e}, "
           f"first-step grad {grad_rel['grads_first'][0]:.3e} ({grad_rel['grads_first'][1]}), "
           f"last-step grad {grad_rel['grads_last'][0]:.3e} ({grad_rel['grads_last'][1]})")
    first_rel = abs(losses[0] - ref_losses[0]).item() / abs(ref_losses[0]).item()
    assert first_rel <= tol.get("loss_first", tol["loss"]), (
        f"{what}: first-step losses differ by {first_rel:.3e} relative")
    assert loss_rel <= tol["loss"], f"{what}: losses differ by {loss_rel:.3e} relative"
    assert norm_rel <= tol["norm"], f"{what}: gradient norms differ by {norm_rel:.3e} relative"
    assert grad_rel["grads_first"][0] <= tol["grad_first"], f"{what}: first-step gradients {grad_rel}"
    assert grad_rel["grads_last"][0] <= tol["grad_last"], f"{what}: last-step gradients {grad_rel}"
    assert ref["losses"][-1] < ref["losses"][0], "the reference did not learn"
    check_routing(got, driver, routing, report)


# --- host driver ----------------------------------------------------------------

HOST_ROUTINGS = list(ROUTINGS["host"])


@pytest.mark.host_only
@pytest.mark.parametrize("routing", HOST_ROUTINGS)
def test_host_inference_fp32(runs, routing, report):
    got, ref = run_inference(runs, "host", routing, "float32", report)
    assert torch.equal(got["tokens"], ref["tokens"])
    assert len(set(ref["tokens"][0].tolist())) > 1, "degenerate decoding: one token repeated"


@pytest.mark.host_only
@pytest.mark.parametrize("routing", HOST_ROUTINGS)
def test_host_inference_bf16(runs, routing, report):
    run_inference(runs, "host", routing, "bfloat16", report)


@pytest.mark.host_only
@pytest.mark.parametrize("routing", HOST_ROUTINGS)
def test_host_training_fp32(runs, routing, report):
    run_training(runs, "host", routing, report)


# --- cuda driver ----------------------------------------------------------------

_needs_flaggems = [pytest.mark.flaggems, pytest.mark.skipif(
    not torch_fl.is_flaggems_enabled(), reason="FlagGems is not enabled (needs the cuda driver and flag_gems)")]
CUDA_ROUTINGS = [pytest.param("default", marks=_needs_flaggems),
                 pytest.param("stub_only", marks=_needs_flaggems), "all_cuda", "mixed"]


@pytest.mark.cuda
@pytest.mark.parametrize("routing", CUDA_ROUTINGS)
def test_cuda_inference_fp32(runs, routing, report):
    got, ref = run_inference(runs, "cuda", routing, "float32", report)
    if routing == "all_cuda":
        assert torch.equal(got["tokens"], ref["tokens"])


@pytest.mark.cuda
@pytest.mark.parametrize("routing", CUDA_ROUTINGS)
def test_cuda_inference_bf16(runs, routing, report):
    run_inference(runs, "cuda", routing, "bfloat16", report)


@pytest.mark.cuda
@pytest.mark.parametrize("routing", CUDA_ROUTINGS)
def test_cuda_training_fp32(runs, routing, report):
    run_training(runs, "cuda", routing, report)
