"""OpInfo differential sweep: PyTorch's OpInfo samples, a reference device vs flagos.

Every float32 sample of every applicable OpInfo in ``op_db`` runs on the
reference device and on flagos, and the results must agree (see
opinfo_sweep.py for exactly what is compared, and docs/opinfo.md for the
numbers and the run commands). Two tests:

- ``test_opinfo_sweep``: host driver, against the CPU (the same kernels and
  the same RNG, so to float32 rounding);
- ``test_opinfo_sweep_against_cuda``: cuda driver, against native CUDA (the
  same kernels and the same generator; OpInfo's cuda tolerance hints allowed).

Each fails when
- fewer than ``MIN_PASS_RATE`` of the compared samples pass;
- an op fails that is not in its known-failures dict (``KNOWN_FAILURES``,
  ``KNOWN_CUDA_FAILURES``): a regression, or a new op;
- an op in that dict no longer fails (fixed: remove its entry, and its row in
  docs/opinfo.md).

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
KNOWN_FAILURES: dict = {}

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
    """Prints the result and asserts the pass rate and the known failures."""
    failed = res.failed_ops
    new = {op: fs for op, fs in failed.items() if op not in known}
    stale = sorted(op for op in known if op not in failed)

    print()
    print(res.summary())
    if res.failures:
        print("failures (op [sample index] error):")
        print("\n".join(res.failure_lines()))
    for name, err in res.sample_gen_errors:
        print(f"sample-generation error: {name}: {err}")
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


@pytest.mark.slow
@pytest.mark.skipif(torch_fl.driver() != "host",
                    reason="the sweep compares with CPU results bit for bit "
                    "(same kernels, same RNG): host driver only")
def test_opinfo_sweep(capsys):
    res = opinfo_sweep.run_sweep(ref="cpu")
    with capsys.disabled():
        _check(res, KNOWN_FAILURES)


def _on_cuda_driver() -> bool:
    return torch_fl.driver() == "cuda" and torch.cuda.is_available()


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not _on_cuda_driver(),
                    reason="compares flagos with native CUDA: needs a GPU and the "
                    "cuda driver")
def test_opinfo_sweep_against_cuda(capsys):
    res = opinfo_sweep.run_sweep(ref="cuda")
    with capsys.disabled():
        _check(res, KNOWN_CUDA_FAILURES)
