"""OpInfo differential sweep: PyTorch's OpInfo samples, a reference device vs flagos.

Every float32 sample of every applicable OpInfo in ``op_db`` runs on the
reference device and on flagos, and the results must agree (see
opinfo_sweep.py for exactly what is compared, and docs/opinfo.md for the
numbers and the run commands). Two tests:

- ``test_opinfo_sweep``: host driver, against the CPU (the same kernels and
  the same RNG, so to float32 rounding);
- ``test_opinfo_sweep_against_cuda``: cuda driver, against native CUDA (the
  same kernels and the same generator; OpInfo's cuda tolerance hints allowed).

Each runs three times: ops called as functions; in their in-place and out=
forms; and with OpInfo's error inputs.

Each fails when
- fewer than ``MIN_PASS_RATE`` of the compared samples pass;
- an op fails that is not in its known-failures dict (``KNOWN_FAILURES``,
  ``KNOWN_CUDA_FAILURES``): a regression, or a new op;
- an op in that dict ran and no longer fails (fixed: remove its entry, and its
  row in docs/opinfo.md). A form's ops carry its name (``narrow_copy(errors)``),
  so one dict per reference serves every form.

One aggregated test per reference: the whole sweep runs in crash-isolated
worker processes (one per core), far faster than ~700 parametrized tests.
"""

import pytest
import torch

import torch_fl
import opinfo_sweep

MIN_PASS_RATE = 0.95

# op name -> why it fails. Empty: every compared sample passes. A new entry
# needs its root cause here and in docs/opinfo.md.
KNOWN_FAILURES: dict = {
    "narrow_copy(errors)": (
        "OpInfo expects a device other than the CPU to run narrow()'s checks (IndexError "
        "'Dimension out of range', 'length must be non-negative'); the host driver runs the "
        "CPU's kernel, narrow_copy_dense_cpu_out, whose errors OpInfo expects on the CPU "
        "(error inputs 1 and 6)"),
}

# The same for the cuda driver against native CUDA (its own list: the causes
# differ from the host driver's). From the first GPU run (H100, torch
# 2.11.0+cu130): 43 of 18,070 compared samples, two root causes.
_JITERATOR = ("torch.cuda.jiterator is a CUDA-only Python API, not an ATen operator: "
              "its binding launches the kernel under a CUDAGuard on the tensors' device, "
              "which refuses flagos (every sample)")
KNOWN_CUDA_FAILURES: dict = {
    "jiterator_unary": _JITERATOR,
    "jiterator_binary": _JITERATOR,
    "jiterator_binary_return_by_ref": _JITERATOR,
    "jiterator_4inputs_with_extra_args": _JITERATOR,
    "jiterator_2inputs_2outputs": _JITERATOR,
    "nn.functional.scaled_dot_product_attention":
        "4-D samples with dropout_p > 0 (4 of 25): on the cuda driver flagos takes "
        "the math path, native CUDA a fused kernel with its own in-kernel dropout "
        "RNG, so the dropout masks differ (docs/opinfo.md)",
}


def _check(res, known: dict) -> None:
    """Prints the result and asserts the pass rate and the known failures of
    the ops the sweep ran (a form's ops are named after it: ``add_``,
    ``add(out=)``, ``add(errors)``)."""
    failed = res.failed_ops
    new = {op: fs for op, fs in failed.items() if op not in known}
    stale = sorted(op for op in known if op in res.op_seconds and op not in failed)

    print()
    print(res.summary())
    if res.failures:
        print("failures (op [sample index] error):")
        print("\n".join(res.failure_lines()))
    for op, err in res.sample_gen_errors:
        print(f"sample-generation error: {op}: {err}")
    if res.nondeterministic:
        print(f"nondeterministic on {res.ref} (compared on shape, dtype and device):")
        print("\n".join(res.nondeterministic_lines()))
    if stale:
        print("stale known failures (these ops pass now):", ", ".join(stale))

    assert res.compared > 0, "the sweep compared nothing"
    rate = res.passed / res.compared
    name = "KNOWN_FAILURES" if res.ref == "cpu" else "KNOWN_CUDA_FAILURES"
    problems = []
    if rate < MIN_PASS_RATE:
        problems.append(f"pass rate {rate:.2%} < {MIN_PASS_RATE:.0%}")
    if new:
        problems.append(f"ops failing that are not in {name}:\n" + "\n".join(
            f"  {f.op} [{f.index}] {f.error}" for fs in new.values() for f in fs))
    if stale:
        problems.append(f"{name} entries that pass now (fixed? remove them "
                        "here and in docs/opinfo.md): " + ", ".join(stale))
    assert not problems, "\n".join(problems) + "\n" + res.summary()


# Each sweep runs each op as a function; through its in-place form and its
# out= form into zero-size tensors it must resize (writes must reach the
# caller's flagos tensors; 2026-11-27: 7,639 of 7,639 on the host, 7,466 of
# 7,466 against CUDA, no known failures); and with OpInfo's error inputs,
# which must raise as OpInfo says (opinfo_sweep.py, "Variants").
FORMS = pytest.mark.parametrize("variants", [("function",), ("inplace", "out"), ("errors",)],
                                ids="+".join)


@pytest.mark.slow
@pytest.mark.skipif(torch_fl.driver() != "host",
                    reason="the sweep compares with CPU results bit for bit "
                    "(same kernels, same RNG): host driver only")
@FORMS
def test_opinfo_sweep(capsys, variants):
    res = opinfo_sweep.run_sweep(ref="cpu", variants=variants)
    with capsys.disabled():
        _check(res, KNOWN_FAILURES)


def _on_cuda_driver() -> bool:
    return torch_fl.driver() == "cuda" and torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not _on_cuda_driver(),
                    reason="compares flagos with native CUDA: needs a GPU and the "
                    "cuda driver")
@FORMS
def test_opinfo_sweep_against_cuda(capsys, variants):
    res = opinfo_sweep.run_sweep(ref="cuda", variants=variants)
    with capsys.disabled():
        _check(res, KNOWN_CUDA_FAILURES)


def test_flaggems_attribution_charges_only_the_culprits():
    """The aggregation behind the FlagGems pass table (the GPU sweep's
    records, made up here): a traced failure is charged to its culprit, its
    other operators pass; a failure that remains with every operator on cuda
    is not FlagGems'; a failure no single operator reproduces is charged to
    each; random operators count apart."""
    res = opinfo_sweep.Result(provider="flaggems")
    recs = [
        dict(kind="sample", op="mul[float32]", i=0, status="pass", dtype="float32",
             used=["mul.Tensor"]),
        dict(kind="sample", op="addcmul[float32]", i=1, status="fail", dtype="float32",
             error="result: mismatch", used=["addcmul", "mul.Tensor"],
             culprits=[["addcmul", "result: mismatch"]]),
        dict(kind="grad", op="addcmul[float32]", i=1, status="fail", dtype="float32",
             error="grad: mismatch", used=["mul.Tensor", "sum"], culprits=[]),
        dict(kind="sample", op="cumsum[float16]", i=0, status="fail", dtype="float16",
             error="x", used=["cumsum"], without_flaggems="x"),
        dict(kind="sample", op="bernoulli[float32]", i=0, status="pass", dtype="float32",
             used=["bernoulli_.float"], random=True, meta=True),
    ]
    for r in recs:
        res.add(r)
    cells = res.gems_ops()
    assert (cells["mul.Tensor"]["float32"].passed, cells["mul.Tensor"]["float32"].failed) == (2, 1)
    assert cells["addcmul"]["float32"].failed == 1 and cells["addcmul"]["float32"].passed == 0
    assert cells["sum"]["float32"].failed == 1
    assert "together" in cells["sum"]["float32"].errors[0][2]
    assert cells["bernoulli_.float"]["float32"].random == 1
    assert "cumsum" not in cells and len(res.not_flaggems) == 1
    assert sorted(res.gems_failed_ops()) == ["addcmul", "mul.Tensor", "sum"]
    assert res.grad_compared == 1 and res.grad_passed == 0
    table = res.gems_table(["addcmul", "mul.Tensor", "sum", "bernoulli_.float", "cumsum", "exp"],
                           ("float32", "float16")).splitlines()
    row = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
           for line in table[2:]}
    assert row["exp"] == ["not reached", "not reached"]
    assert row["addcmul"][0] == "**fail** 1/1"
    assert row["mul.Tensor"][0] == "**fail** 1/3"
    assert row["bernoulli_.float"][0] == "random: shape 1"
    with pytest.raises(ValueError, match="ref='cuda'"):
        opinfo_sweep.run_sweep(provider="flaggems")
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        opinfo_sweep.run_sweep(dtypes=("float64",))
    with pytest.raises(ValueError, match=r"\['inout'\]: choose from function, inplace, out, errors"):
        opinfo_sweep.run_sweep(variants=("inout",))


def test_flaggems_failure_every_operator_reproduces_is_not_charged():
    res = opinfo_sweep.Result(provider="flaggems")
    used = ["neg", "sub.Tensor", "zero_"]
    res.add(dict(kind="grad", op="linalg.householder_product[float32]", i=3, status="fail",
                 dtype="float32", error="grad[0]: mismatch", used=used,
                 culprits=[[u, "grad[0]: mismatch"] for u in used]))
    assert not res.gems_failed_ops()
    assert res.unattributed == [("linalg.householder_product[float32] backward", 3,
                                 "grad[0]: mismatch", used)]
