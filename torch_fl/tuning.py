"""torch_fl.tuning: routes chosen by measuring the workload's own calls.

    with torch_fl.tuning.tune() as t:
        run_my_workload()
    t.write_config("backends.conf")      # then FLAGOS_BACKEND_CONFIG=backends.conf
    print(t.summary())

or, for a whole program, ``python -m torch_fl tune --out backends.conf -- python
my_script.py args``. While tuning, every routed call is counted by its signature
(operator, shapes, dtypes, strides, scalar values), and the first call of each
signature is measured on every backend of this driver that serves the operator,
on copies of its inputs, after a correctness check against the reference
kernels. Each operator is then routed to the backend with the least time over
the workload's calls, among those correct on every signature; the cost of a
call is max(host time, device time), so a backend whose kernels are faster but
whose host cost would stall the device does not win. Docs: docs/tuning.md.
"""

import atexit
import datetime
import glob
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
from typing import NamedTuple

from . import _C, _rundata

# A backend replaces the operator's current route only when it saves more
# than this fraction of the operator's time, and more than MIN_GAIN_US per
# call: measurements of equal kernels differ by a few percent.
MARGIN = 0.05
MIN_GAIN_US = 0.2
# A note says speed depends on shape when the backends that win some
# signatures hold at least this share of the operator's time.
SHAPE_NOTE_SHARE = 0.10
OPTIONS_FILE = "options.json"


class Decision(NamedTuple):
    op: str  # "aten::add.Tensor"
    chosen: str  # the backend written to the config ("" when the op is not tuned)
    current: str  # the operator's route during the run
    calls: int
    signatures: int
    per_call_us: dict  # backend -> cost per call (max of host and device), weighted by calls
    host_us: dict  # backend -> host time per call, weighted
    device_us: dict  # backend -> device time per call, weighted
    rejected: dict  # backend -> why it cannot be chosen
    note: str  # shape dependence, why the op is not tuned, ...

    @property
    def name(self) -> str:
        return self.op[6:] if self.op.startswith("aten::") else self.op


def _cost(r: dict) -> float:
    return max(r["host_us"], r["device_us"])


def decide(data: dict, margin: float = MARGIN, min_gain_us: float = MIN_GAIN_US) -> list:
    """One :class:`Decision` per operator of the data's signatures."""
    by_op = {}
    for s in data["signatures"]:
        by_op.setdefault(s["op"], []).append(s)
    out = []
    for op, sigs in sorted(by_op.items()):
        calls = sum(s["calls"] for s in sigs)
        current = sigs[0]["route"]
        measured = [s for s in sigs if not s["skipped"] and s["results"]]
        if not measured:
            reasons = sorted({s["skipped"] or "not measured" for s in sigs})
            out.append(Decision(op, "", current, calls, len(sigs), {}, {}, {}, {},
                                "not tuned: " + "; ".join(reasons)))
            continue
        backends = []
        for s in measured:
            for r in s["results"]:
                if r["backend"] not in backends:
                    backends.append(r["backend"])
        weight = sum(s["calls"] for s in measured)
        cost, host, device, rejected = {}, {}, {}, {}
        for b in backends:
            total = [0.0, 0.0, 0.0]
            for s in measured:
                r = next((x for x in s["results"] if x["backend"] == b), None)
                if r is None:
                    rejected[b] = f"does not serve {s['signature']}"
                    break
                if r["status"] == "error" or (r["checked"] and not r["correct"]):
                    rejected[b] = f"wrong on {s['signature']}: {r['problem']}"
                    break
                if r["status"] == "not timed":
                    rejected[b] = f"not timed on {s['signature']}: {r['note']}"
                    break
                total[0] += s["calls"] * _cost(r)
                total[1] += s["calls"] * r["host_us"]
                total[2] += s["calls"] * r["device_us"]
            else:
                cost[b], host[b], device[b] = (t / weight for t in total)
        note = ""
        skipped = [s for s in sigs if s not in measured]
        if skipped:
            note = (f"{sum(s['calls'] for s in skipped)} calls of {len(skipped)} signature(s) not "
                    f"measured ({skipped[0]['skipped']}); ")
        if not cost:
            out.append(Decision(op, "", current, calls, len(sigs), cost, host, device, rejected,
                                note + "not tuned: no backend was correct on every signature"))
            continue
        # Ties (the same kernels under two names: cpu and native on the host
        # driver, cuda and native on the cuda driver) keep the current route,
        # else take the name that was measured (native, cuda).
        aliases = {r["backend"] for x in measured for r in x["results"] if r["status"] == "same"}
        order = sorted(cost, key=lambda b: (cost[b], b != current, b in aliases))
        best = order[0]
        chosen = best
        if current in cost and best != current:
            gain = cost[current] - cost[best]
            if gain <= margin * cost[current] or gain <= min_gain_us:
                chosen = current
        note += _shape_note(measured, {b: c for b, c in cost.items() if b not in aliases})
        out.append(Decision(op, chosen, current, calls, len(sigs), cost, host, device, rejected,
                            note.rstrip("; ")))
    return out


def _shape_note(measured: list, cost: dict) -> str:
    """Says when different signatures have different fastest backends."""
    wins, total = {}, 0.0
    for s in measured:
        rs = {r["backend"]: _cost(r) for r in s["results"] if r["backend"] in cost}
        if not rs:
            continue
        b = min(rs, key=lambda k: rs[k])
        t = s["calls"] * rs[b]
        wins.setdefault(b, [0, 0.0])
        wins[b][0] += 1
        wins[b][1] += t
        total += t
    if len(wins) < 2 or total <= 0:
        return ""
    shares = sorted(wins.items(), key=lambda kv: -kv[1][1])
    if shares[1][1][1] / total < SHAPE_NOTE_SHARE:
        return ""
    return ("speed depends on shape: " + ", ".join(
        f"{b} fastest on {n} signature(s) ({100 * t / total:.0f}% of the time)"
        for b, (n, t) in shares) + "; chosen by total time; ")


def _us(x: float) -> str:
    return f"{x:.3g} us" if x < 1000 else f"{x / 1000:.3g} ms"


def evidence(d: Decision) -> str:
    """The comment written after the operator's config line."""
    parts = [f"{d.calls} call{'s' if d.calls != 1 else ''}, {d.signatures} signature"
             f"{'s' if d.signatures != 1 else ''}"]
    if d.per_call_us:
        times = []
        for b in sorted(d.per_call_us, key=lambda b: d.per_call_us[b]):
            t = f"{b} {_us(d.per_call_us[b])}"
            if abs(d.host_us[b] - d.device_us[b]) > 0.05 * d.per_call_us[b]:
                t += f" (host {_us(d.host_us[b])}, device {_us(d.device_us[b])})"
            times.append(t)
        parts.append("per call: " + ", ".join(times))
    for b, why in sorted(d.rejected.items()):
        parts.append(f"{b} rejected: {why}")
    if d.chosen and d.chosen != d.current:
        parts.append(f"was {d.current}")
    if d.note:
        parts.append(d.note)
    return _one_line("; ".join(parts))


def _one_line(text: str, limit: int = 0) -> str:
    """Comment text that stays on one line (a `python -c` workload has newlines)."""
    text = " ".join(str(text).split())
    return text if not limit or len(text) <= limit else text[:limit - 3] + "..."


def _same_kernel_note(data: dict) -> str:
    if data["driver"] == "host" and set(data["backends"]) <= {"cpu", "native"}:
        return ("On the host driver the only backends are cpu and native, which run the same "
                "zero-copy CPU kernels: there is nothing to choose between, so every operator "
                "keeps native; the file records the routes and their measurements.")
    if data["driver"] == "cuda" and "flaggems" not in data["backends"]:
        return ("FlagGems is not enabled here: cuda and native are the same kernels, and the cpu "
                "route copies every input; expect cuda everywhere.")
    return ""


def _base_entries(data: dict, tuned: set) -> list:
    """Entries of the config file in force during the run that the tuned lines
    do not replace: (text, comment)."""
    path = data.get("config") or ""
    if not path or not os.path.isfile(path):
        return []
    try:
        with open(path, "rb") as f:
            entries, _ = _C._parse_config(f.read(), path)
    except OSError:
        return []
    out = []
    for op, chain, line in entries:
        if op in tuned:
            continue
        out.append((f"{op} = {', '.join(chain)}", f"from {path}:{line}"))
    return out


def config_text(data: dict, decisions: list) -> str:
    """The tuned backends.conf."""
    tuned = [d for d in decisions if d.chosen]
    untuned = [d for d in decisions if not d.chosen]
    calls = sum(d.calls for d in decisions)
    lines = [
        "# torch_fl routing, tuned by measuring a workload's own calls (docs/tuning.md).",
        f"# {datetime.datetime.now().isoformat(timespec='seconds')}: driver {data['driver']} "
        f"({_one_line(data['device_name'])}), torch {data['torch']}, backends "
        f"{', '.join(data['backends'])}",
    ]
    if data.get("command"):
        lines.append("# workload: " + _one_line(shlex.join(data["command"]), 400))
    lines += [
        f"# {calls} routed calls of {len(decisions)} operators, "
        f"{len(data['signatures'])} signatures.",
        "# Each operator goes to the backend with the least time over the workload's calls,",
        "# among those whose outputs matched the reference kernels "
        f"({data['reference']}) on every signature;",
        "# a call costs max(host time, device time); a backend must save more than "
        f"{MARGIN:.0%} to replace the route in force.",
    ]
    note = _same_kernel_note(data)
    if note:
        lines.append("# " + note)
    if data.get("env_routes"):
        lines.append("# FLAGOS_OP_* variables were set during tuning and still override this file: "
                     + ", ".join(f"{k}={v}" for k, v in sorted(data["env_routes"].items())))
    lines.append("")
    width = max((len(f"{d.name} = {d.chosen}") for d in tuned), default=0)
    for d in tuned:
        lines.append(f"{d.name + ' = ' + d.chosen:<{width}}  # {evidence(d)}")
    base = _base_entries(data, {d.name for d in tuned})
    if base:
        lines += ["", "# Carried over from the config in force during the run (not tuned here):"]
        lines += [f"{text}  # {why}" for text, why in base]
    if untuned:
        lines += ["", "# Called but not tuned (they keep the route the rest of this file gives them):"]
        lines += [f"#   {d.name}: {d.calls} calls on {d.current}; {_one_line(d.note)}" for d in untuned]
    return "\n".join(lines) + "\n"


def summary(data: dict, decisions: list, top: int = 25) -> str:
    """What tuning found, as text."""
    measured = sum(1 for s in data["signatures"] if s["results"])
    calls = sum(d.calls for d in decisions)
    lines = [f"tune: driver {data['driver']} ({data['device_name']}); {calls} routed calls of "
             f"{len(decisions)} operators, {len(data['signatures'])} signatures, "
             f"{measured} measured on {', '.join(data['backends'])}."]
    note = _same_kernel_note(data)
    if note:
        lines.append(note)
    changed = [d for d in decisions if d.chosen and d.chosen != d.current]
    saved = sum(d.calls * (d.per_call_us[d.current] - d.per_call_us[d.chosen])
                for d in changed if d.current in d.per_call_us)
    total = sum(d.calls * d.per_call_us[d.chosen] for d in decisions if d.chosen)
    lines.append(f"{len(changed)} operator(s) change route"
                 + (f"; expected saving {saved / 1000:.3g} ms over the workload's routed calls "
                    f"(tuned total {total / 1000:.3g} ms)" if changed else "") + ".")
    bad = [(d, b, why) for d in decisions for b, why in d.rejected.items() if why.startswith("wrong")]
    for d, b, why in bad:
        lines.append(f"  {d.name}: {b} rejected, {why}")
    rows = sorted((d for d in decisions if d.chosen), key=lambda d: -d.calls * d.per_call_us[d.chosen])
    if rows:
        backends = [b for b in data["backends"] if any(b in d.per_call_us for d in rows)]
        head = f"{'operator':<34} {'calls':>7} {'chosen':<9} " + " ".join(f"{b:>10}" for b in backends)
        lines += ["", "per call (us), weighted over the workload's signatures:", head]
        for d in rows[:top]:
            cells = " ".join(f"{d.per_call_us[b]:>10.3g}" if b in d.per_call_us else f"{'-':>10}"
                             for b in backends)
            lines.append(f"{d.name[:34]:<34} {d.calls:>7} {d.chosen:<9} {cells}")
        if len(rows) > top:
            lines.append(f"... {len(rows) - top} more operators in the config file")
    return "\n".join(lines)


class Tuner:
    """Records and measures the routed calls made inside its ``with`` block.

    ``budget_ms``: timing budget per signature and backend; ``max_iters``:
    calls per timed batch at most; ``verify``: also shadow-verify every call
    (torch_fl.verify), whose divergences reject the backend that produced them;
    ``cpu_copy_max_mib``: on the cuda driver, the cpu route (a copy round trip)
    is timed only for inputs up to this size.
    """

    def __init__(self, budget_ms: float = 10.0, max_iters: int = 100, verify: bool = False,
                 cpu_copy_max_mib: float = 1.0):
        self.options = dict(budget_ms=float(budget_ms), max_iters=int(max_iters),
                            cpu_copy_max_bytes=int(cpu_copy_max_mib * (1 << 20)))
        self.verify = bool(verify)
        self.data = None
        self._decisions = None
        self._verify_before = None

    def __enter__(self):
        from . import verify

        _C._tune_start(self.options["budget_ms"], self.options["max_iters"],
                       self.options["cpu_copy_max_bytes"])
        if self.verify:
            self._verify_before = verify.mode()
            verify.reset()
            verify.enable("1")
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def stop(self) -> dict:
        """Ends recording (idempotent) and returns the data."""
        if self.data is None:
            _C._tune_stop()
            self.data = _rundata.snapshot("tune")
            if self.verify:
                _C._set_verify_mode(self._verify_before)
                _reject_diverging(self.data)
            self._decisions = decide(self.data)
            self.data["decisions"] = [d._asdict() for d in self._decisions]
        return self.data

    @property
    def decisions(self) -> list:
        self.stop()
        return self._decisions

    def config_text(self) -> str:
        return config_text(self.stop(), self.decisions)

    def write_config(self, path: str) -> str:
        """Writes the tuned config to ``path``; returns its text."""
        text = self.config_text()
        with open(path, "w") as f:
            f.write(text)
        return text

    def save(self, path: str) -> None:
        """Writes the measurements (what ``python -m torch_fl report --from`` reads)."""
        _rundata.save(self.stop(), path)

    def summary(self) -> str:
        return summary(self.stop(), self.decisions)


def tune(**options) -> Tuner:
    """A :class:`Tuner` to use as a context manager."""
    return Tuner(**options)


def _reject_diverging(data: dict) -> None:
    """Shadow verification saw calls of a routed backend diverge: that backend
    is wrong for the operator, whatever the first call of each signature said."""
    bad = {(r["op"], r["backend"]): r for r in data["verify"]["records"] if r["failed"]}
    for s in data["signatures"]:
        for r in s["results"]:
            v = bad.get((s["op"], r["backend"]))
            if v is not None and r["correct"]:
                r["correct"] = False
                r["checked"] = True
                r["problem"] = (f"shadow verification: {v['failed']} of {v['compared']} calls "
                                f"diverge, first {v['first_failure_call']}: {v['first_failure']}")


# ---- FLAGOS_TUNE: the process side of `python -m torch_fl tune` ------------------

def _start_from_env() -> None:
    """Called at import when FLAGOS_TUNE names a directory: records this
    process's calls and writes DIR/tune-PID.json at exit."""
    directory = os.environ["FLAGOS_TUNE"]
    options = {}
    path = os.path.join(directory, OPTIONS_FILE)
    if os.path.isfile(path):
        with open(path) as f:
            options = json.load(f)
    tuner = Tuner(**options)
    tuner.__enter__()

    def finish():
        data = tuner.stop()
        if data["verify"]["mode"] != "0" and not tuner.verify:  # stop() did it then
            _reject_diverging(data)
        _rundata.save(data, os.path.join(directory, f"tune-{os.getpid()}.json"))

    atexit.register(finish)


def run_cli(command: list, out: str, data_path: str, verify: bool, budget_ms: float,
            max_iters: int) -> int:
    """``python -m torch_fl tune``: runs ``command`` with tuning on, then
    writes the config and the data file."""
    if not command:
        print("tune: no workload: write it after --, e.g. "
              "python -m torch_fl tune --out backends.conf -- python train.py", file=sys.stderr)
        return 2
    # Checked before the workload runs, not after it.
    if not (math.isfinite(budget_ms) and budget_ms > 0):
        print(f"tune: --budget-ms {budget_ms} is not valid: a positive number of milliseconds",
              file=sys.stderr)
        return 2
    if max_iters < 1:
        print(f"tune: --max-iters {max_iters} is not valid: at least 1", file=sys.stderr)
        return 2
    if os.path.abspath(out) == os.path.abspath(data_path):
        print(f"tune: --out and --data are one file ({out!r}): the data would overwrite the config",
              file=sys.stderr)
        return 2
    for path, what in ((out, "--out"), (data_path, "--data")):
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent) or os.path.isdir(path):
            print(f"tune: {what} {path!r} cannot be written: name a file in an existing directory",
                  file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="flagos-tune-") as d:
        with open(os.path.join(d, OPTIONS_FILE), "w") as f:
            json.dump({"budget_ms": budget_ms, "max_iters": max_iters, "verify": verify}, f)
        env = dict(os.environ)
        env["FLAGOS_TUNE"] = d
        if verify:
            env["FLAGOS_VERIFY"] = "1"
        print(f"tune: running {' '.join(command)}", file=sys.stderr, flush=True)
        try:
            rc = subprocess.call(command, env=env)
        except OSError as e:
            print(f"tune: cannot run {command[0]!r}: {e}", file=sys.stderr)
            return 2
        parts = [_rundata.load(p) for p in sorted(glob.glob(os.path.join(d, "tune-*.json")))]
    if rc != 0:
        print(f"tune: the workload exited with status {rc}; no config written", file=sys.stderr)
        return rc if rc > 0 else 1
    if not parts:
        print("tune: the workload left no tuning data: did it import torch (torch_fl loads with "
              "it) and run on device='flagos'?", file=sys.stderr)
        return 1
    data = _rundata.merge(parts)
    if not data["signatures"]:
        print("tune: the workload made no routed call on the flagos device; no config written",
              file=sys.stderr)
        return 1
    data["command"] = list(command)
    decisions = decide(data)
    data["decisions"] = [d._asdict() for d in decisions]
    with open(out, "w") as f:
        f.write(config_text(data, decisions))
    _rundata.save(data, data_path)
    from . import routing

    problems = routing.check_config(out)
    print(summary(data, decisions))
    print(f"\nwrote {out} ({sum(1 for d in decisions if d.chosen)} operators; check-config: "
          f"{'OK' if not problems else f'{len(problems)} error(s)'}) and {data_path}")
    print(f"use it with FLAGOS_BACKEND_CONFIG={out}; "
          f"python -m torch_fl report --from {data_path} plots it")
    for p in problems:
        print(f"  {p}", file=sys.stderr)
    return 1 if problems else 0


__all__ = ["Decision", "Tuner", "config_text", "decide", "evidence", "summary", "tune"]
