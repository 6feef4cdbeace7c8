"""torch_fl.report: a routing report, as one self-contained HTML or Markdown file.

The report reads a data file: the one ``python -m torch_fl tune`` writes
(tune-data.json: per-backend times of every operator, the chosen routes), or
the one a program writes at exit when run with ``FLAGOS_REPORT=run.json``
(routes, call counts, host time per operator and backend, CPU fallbacks, and
verification results when FLAGOS_VERIFY was on). It shows time per operator
per backend, the chosen route, call counts, CPU fallbacks and verification
results, with a plot embedded as a PNG (matplotlib)::

    python -m torch_fl report --from tune-data.json --out report.html

Docs: docs/tuning.md.
"""

import base64
import html
import io
import os

from . import _rundata

TOP = 20  # operators in the plot
# Every key routing.stats() and the profile may use, or the plot leaves those calls out.
COLORS = {"flaggems": "#e67e22", "flaggems-python": "#f5b041", "cuda": "#27ae60",
          "cpu": "#2e86c1", "native": "#7f8c8d", "metax": "#8e44ad", "ascend": "#c0392b",
          "cpu fallback": "#e74c3c"}


def _matplotlib():
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise RuntimeError(
            "the routing report's plot needs matplotlib, which is not installed "
            f"({e}): pip install matplotlib==3.10.9 (the version requirements-dev.txt pins)"
        ) from None
    return Figure, FigureCanvasAgg


def collect() -> dict:
    """This process's routing data (what FLAGOS_REPORT writes at exit)."""
    return _rundata.snapshot("run")


def save(path: str) -> None:
    """Writes this process's routing data to ``path`` (JSON)."""
    _rundata.save(collect(), path)


# ---- the per-operator view of a data file -------------------------------------

def _rows(data: dict) -> list:
    """One dict per operator: calls by backend, fallbacks, route, times, verification."""
    from .tuning import decide

    rows = {}

    def row(op):
        return rows.setdefault(op, {"op": op, "calls": {}, "fallbacks": 0, "route": "",
                                    "source": "", "time_ms": {}, "per_call_us": {}, "chosen": "",
                                    "rejected": {}, "note": "", "verify": []})

    for s in data["stats"]:
        r = row(s["op"])
        r["calls"] = dict(s["calls"])
        r["fallbacks"] = s["cpu_fallbacks"]
    for t in data["table"]:
        if t["resolved"] and t["op"] in rows:
            rows[t["op"]]["route"] = t["backend"] + (" (cpu fallback)" if t["cpu_fallback"] else "")
            rows[t["op"]]["source"] = t["source"]
    for p in data["profile"]:
        row(p["op"])["time_ms"][p["backend"]] = p["host_us"] / 1000
    if data["signatures"]:
        for d in decide(data):
            r = row(d.op)
            r["per_call_us"] = d.per_call_us
            r["time_ms"] = {b: d.calls * us / 1000 for b, us in d.per_call_us.items()}
            r["chosen"] = d.chosen
            r["rejected"] = d.rejected
            r["note"] = d.note
            if not r["calls"]:
                r["calls"] = {d.current: d.calls}
    for v in data["verify"]["records"]:
        row(v["op"])["verify"].append(v)
    return list(rows.values())


def _total_calls(r):
    return sum(r["calls"].values())  # CPU fallbacks are counted under cpu too


def _time_of(r):
    if r["chosen"] and r["chosen"] in r["time_ms"]:
        return r["time_ms"][r["chosen"]]
    return sum(r["time_ms"].values())


def _short(op: str) -> str:
    return op[6:] if op.startswith("aten::") else op


def _diverges(r) -> bool:
    return any(v["failed"] for v in r["verify"])


def _label_ops(ax, rows) -> None:
    """Operator names down the y axis, top first; those that diverged in red."""
    ax.set_yticks(range(len(rows)), [_short(r["op"]) for r in rows], fontsize=8)
    for lab, r in zip(ax.get_yticklabels(), rows):
        if _diverges(r):
            lab.set_color("#c0392b")
    ax.invert_yaxis()


def plot_png(data: dict) -> bytes:
    """The report's figure: time per operator per backend, and calls by backend."""
    return _plot_png(data, _rows(data))


def _plot_png(data: dict, rows: list) -> bytes:
    Figure, FigureCanvasAgg = _matplotlib()
    timed = sorted((r for r in rows if r["time_ms"]), key=_time_of, reverse=True)[:TOP]
    called = sorted((r for r in rows if _total_calls(r)), key=_total_calls, reverse=True)[:TOP]
    n = max(len(timed), len(called), 1)
    fig = Figure(figsize=(13, 1.2 + 0.32 * n))
    FigureCanvasAgg(fig)
    ax_t, ax_c = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    tune = bool(data["signatures"])

    if timed:
        backends = [b for b in COLORS if any(b in r["time_ms"] for r in timed)]
        height = 0.8 / max(len(backends), 1)
        for i, b in enumerate(backends):
            ys, xs, edges = [], [], []
            for y, r in enumerate(timed):
                if r["time_ms"].get(b, 0) > 0:
                    ys.append(y - 0.4 + height * (i + 0.5))
                    xs.append(r["time_ms"][b])
                    edges.append(2.0 if r["chosen"] == b else 0.0)
            ax_t.barh(ys, xs, height=height, color=COLORS[b], label=b, edgecolor="black",
                      linewidth=edges)
        _label_ops(ax_t, timed)
        ax_t.set_xscale("log")
        ax_t.set_xlabel("time over the workload (ms, log scale)")
        ax_t.set_title("each backend's time for the workload's calls (outlined: chosen)"
                       if tune else "host time per operator and backend", fontsize=10)
        ax_t.legend(fontsize=8, loc="lower right")
    else:
        ax_t.axis("off")
        ax_t.text(0.5, 0.5, "no times: run with FLAGOS_REPORT=... (host time per call)\n"
                  "or python -m torch_fl tune (host and device time per backend)",
                  ha="center", va="center", fontsize=9)

    if called:
        backends = [b for b in COLORS if b != "cpu fallback" and any(b in r["calls"] for r in called)]
        left = [0.0] * len(called)
        for b in backends + ["cpu fallback"]:
            # Fallback calls are among the cpu calls: drawn apart, in red.
            xs = [r["fallbacks"] if b == "cpu fallback" else
                  r["calls"].get(b, 0) - (r["fallbacks"] if b == "cpu" else 0) for r in called]
            if not any(xs):
                continue
            ax_c.barh(range(len(called)), xs, left=left, color=COLORS[b], label=b)
            left = [a + x for a, x in zip(left, xs)]
        _label_ops(ax_c, called)
        ax_c.set_xlabel("calls")
        ax_c.set_title("calls, by the backend that ran them", fontsize=10)
        ax_c.legend(fontsize=8, loc="lower right")
    else:
        ax_c.axis("off")
    if any(_diverges(r) for r in rows):
        fig.suptitle("operators in red diverged from the reference in verification",
                     color="#c0392b", fontsize=9, y=0.995)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


# ---- the document -----------------------------------------------------------------

def _fmt_calls(r) -> str:
    s = ", ".join(f"{b} {n}" for b, n in sorted(r["calls"].items()))
    if r["fallbacks"]:
        s += f" (of which {r['fallbacks']} CPU fallbacks)"
    return s or "-"


def _fmt_times(r) -> str:
    if r["per_call_us"]:
        return ", ".join(f"{b} {us:.3g} us/call" for b, us in
                         sorted(r["per_call_us"].items(), key=lambda kv: kv[1]))
    return ", ".join(f"{b} {ms:.3g} ms" for b, ms in sorted(r["time_ms"].items()))


def _fmt_verify(r) -> str:
    if not r["verify"]:
        return "-"
    out = []
    for v in r["verify"]:
        if v["failed"]:
            out.append(f"DIVERGES on {v['backend']}: {v['failed']}/{v['compared']} calls, max abs "
                       f"{v['max_abs']:.3g}, max rel {v['max_rel']:.3g}; first "
                       f"{v['first_failure_call']}: {v['first_failure']}")
        elif v["compared"]:
            out.append(f"ok on {v['backend']} ({v['compared']} calls, max abs {v['max_abs']:.3g})")
        else:
            out.append(f"not compared on {v['backend']}: {v['skip_reason']}")
    return "; ".join(out)


def _sections(data: dict, rows: list) -> tuple:
    """(title, meta lines, table header, table rows, diverging, fallbacks)."""
    rows = sorted(rows, key=lambda r: (-_time_of(r), -_total_calls(r), r["op"]))
    tune = bool(data["signatures"])
    title = "torch_fl routing report" + (" (tuning)" if tune else "")
    meta = [f"driver {data['driver']} ({data['device_name']}), torch {data['torch']}, torch_fl "
            f"{data['torch_fl']}; backends: {', '.join(data['backends'])}",
            f"data: {data['kind']} of {data['created']}"
            + (f", {data.get('processes', 1)} processes" if data.get("processes", 1) > 1 else ""),
            f"config in force: {data['config'] or '(none)'}"]
    if data.get("command"):
        import shlex

        meta.append("workload: " + shlex.join(data["command"]))
    calls = sum(_total_calls(r) for r in rows)
    fallbacks = [r for r in rows if r["fallbacks"]]
    diverging = [r for r in rows if _diverges(r)]
    meta.append(f"{calls} routed calls of {len(rows)} operators; {len(fallbacks)} operator(s) with "
                f"CPU fallbacks; verification: "
                + ("off" if not data["verify"]["records"] else
                   f"{len(diverging)} operator(s) diverge from the reference ({data['reference']})"))
    if tune:
        from .tuning import _same_kernel_note

        note = _same_kernel_note(data)
        if note:
            meta.append(note)
    head = ["operator", "calls by backend", "route (source)", "CPU fallbacks",
            "time per backend" + (" (tuning, per call)" if tune else " (host, total)")]
    if tune:
        head.append("chosen")
    head.append("verification")
    table = []
    for r in rows:
        cells = [_short(r["op"]), _fmt_calls(r), f"{r['route'] or '-'} ({r['source'] or '-'})",
                 str(r["fallbacks"]), _fmt_times(r) or "-"]
        if tune:
            why = "; ".join(f"{b} rejected: {w}" for b, w in r["rejected"].items())
            cells.append((r["chosen"] or "not tuned") + (f" ({r['note']})" if r["note"] else "")
                         + (f" [{why}]" if why else ""))
        cells.append(_fmt_verify(r))
        table.append(cells)
    return title, meta, head, table, diverging, fallbacks


def render(data: dict, fmt: str) -> str:
    """The report as text: ``fmt`` is ``"html"`` or ``"md"``."""
    if fmt not in ("html", "md"):
        raise ValueError(f"report format {fmt!r} is not valid: use html or md")
    rows = _rows(data)  # decide() runs once for the plot and the tables
    png = base64.b64encode(_plot_png(data, rows)).decode("ascii")
    title, meta, head, table, diverging, fallbacks = _sections(data, rows)
    if fmt == "md":
        def cell(x):
            return str(x).replace("|", "\\|").replace("\n", " ")
        out = [f"# {title}", ""] + [f"- {cell(m)}" for m in meta] + [
            "", f"![time per operator per backend, and calls](data:image/png;base64,{png})", ""]
        if diverging:
            out += ["## Diverging operators", ""]
            out += [f"- **{cell(_short(r['op']))}**: {cell(_fmt_verify(r))}" for r in diverging]
            out.append("")
        if fallbacks:
            out += ["## CPU fallbacks", ""]
            out += [f"- {cell(_short(r['op']))}: {r['fallbacks']} calls" for r in fallbacks]
            out.append("")
        out += ["## Operators", "", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in table]
        return "\n".join(out) + "\n"
    e = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{e(title)}</title>",
           "<style>body{font-family:sans-serif;margin:2em;font-size:14px}"
           "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;"
           "vertical-align:top;text-align:left}th{background:#eee}.bad{color:#c0392b}"
           "img{max-width:100%}</style></head><body>", f"<h1>{e(title)}</h1>", "<ul>"]
    out += [f"<li>{e(m)}</li>" for m in meta]
    out += ["</ul>", f"<img alt='time per operator per backend, and calls' "
            f"src='data:image/png;base64,{png}'>"]
    if diverging:
        out += ["<h2>Diverging operators</h2>", "<ul>"]
        out += [f"<li class='bad'><b>{e(_short(r['op']))}</b>: {e(_fmt_verify(r))}</li>"
                for r in diverging]
        out.append("</ul>")
    if fallbacks:
        out += ["<h2>CPU fallbacks</h2>", "<ul>"]
        out += [f"<li>{e(_short(r['op']))}: {r['fallbacks']} calls</li>" for r in fallbacks]
        out.append("</ul>")
    out += ["<h2>Operators</h2>", "<table>",
            "<tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    for row in table:
        cls = " class='bad'" if "DIVERGES" in row[-1] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>")
    out += ["</table>", "</body></html>"]
    return "\n".join(out) + "\n"


def build(source, out: str) -> str:
    """Writes the report of ``source`` (a data dict or a data file's path) to
    ``out``; the format follows its extension (.html, .htm or .md; .png writes
    the plot alone)."""
    data = _rundata.load(source) if isinstance(source, (str, os.PathLike)) else source
    ext = os.path.splitext(str(out))[1].lower()
    fmt = {".html": "html", ".htm": "html", ".md": "md", ".markdown": "md", ".png": "png"}.get(ext)
    if fmt is None:
        raise ValueError(f"report file {out!r}: name it .html or .md (or .png for the plot "
                         "alone): the format follows the extension")
    if fmt == "png":
        png = plot_png(data)
        with open(out, "wb") as f:
            f.write(png)
        return str(out)
    text = render(data, fmt)
    with open(out, "w") as f:
        f.write(text)
    return str(out)


def _start_from_env() -> None:
    """FLAGOS_REPORT=path: host time per operator is recorded, and the data is
    written to the path at exit."""
    import atexit

    from . import _C

    # "{pid}" and "{rank}" give each process of a multi-process run its own file.
    path = os.environ["FLAGOS_REPORT"]
    if "{" in path:
        path = path.replace("{pid}", str(os.getpid())).replace("{rank}", os.environ.get("RANK", "0"))
    path = os.path.abspath(path)
    _rundata.check_writable(path, "FLAGOS_REPORT")
    _C._set_profiling(True)
    atexit.register(lambda: _rundata.save(collect(), path))


__all__ = ["build", "collect", "plot_png", "render", "save"]
