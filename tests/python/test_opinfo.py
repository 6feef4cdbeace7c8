"""OpInfo differential sweep: PyTorch's OpInfo samples, CPU vs flagos.

Every float32 sample of every applicable OpInfo in ``op_db`` runs on the CPU
and on flagos, and the results must agree (see opinfo_sweep.py for exactly
what is compared, and docs/opinfo.md for the numbers and the run command).

The test fails when
- fewer than ``MIN_PASS_RATE`` of the compared samples pass;
- an op fails that is not in ``KNOWN_FAILURES`` (a regression, or a new op);
- an op in ``KNOWN_FAILURES`` no longer fails (fixed: remove its entry, and
  its row in docs/opinfo.md).

One aggregated test: the whole sweep takes 20-50 s in crash-isolated worker
processes (one per core), far less than ~700 parametrized tests would.
"""

import pytest

import torch_fl
import opinfo_sweep

MIN_PASS_RATE = 0.95

# op name -> why it fails. Empty: every compared sample passes. A new entry
# needs its root cause here and in docs/opinfo.md.
KNOWN_FAILURES: dict = {}


@pytest.mark.slow
@pytest.mark.skipif(torch_fl.driver() != "host",
                    reason="the sweep compares with CPU results bit for bit "
                    "(same kernels, same RNG): host driver only")
def test_opinfo_sweep(capsys):
    res = opinfo_sweep.run_sweep()
    failed = res.failed_ops
    new = {op: fs for op, fs in failed.items() if op not in KNOWN_FAILURES}
    stale = sorted(op for op in KNOWN_FAILURES if op not in failed)

    with capsys.disabled():
        print()
        print(res.summary())
        if res.failures:
            print("failures (op [sample index] error):")
            print("\n".join(res.failure_lines()))
        for name, err in res.sample_gen_errors:
            print(f"sample-generation error: {name}: {err}")
        if stale:
            print("stale KNOWN_FAILURES (these ops pass now):", ", ".join(stale))

    assert res.compared > 0, "the sweep compared nothing"
    rate = res.passed / res.compared
    problems = []
    if rate < MIN_PASS_RATE:
        problems.append(f"pass rate {rate:.2%} < {MIN_PASS_RATE:.0%}")
    if new:
        problems.append("ops failing that are not in KNOWN_FAILURES:\n" + "\n".join(
            f"  {f.op} [{f.index}] {f.error}" for fs in new.values() for f in fs))
    if stale:
        problems.append("KNOWN_FAILURES entries that pass now (fixed? remove them "
                        "here and in docs/opinfo.md): " + ", ".join(stale))
    assert not problems, "\n".join(problems) + "\n" + res.summary()
