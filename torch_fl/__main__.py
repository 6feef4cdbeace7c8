"""python -m torch_fl: inspect the installation and the routing configuration.

    python -m torch_fl info
    python -m torch_fl routes [--op NAME]
    python -m torch_fl check-config FILE
    python -m torch_fl tune [--out backends.conf] [--data tune-data.json] [--verify] -- CMD...
    python -m torch_fl report [--from tune-data.json] [--out report.html|report.md]
"""

import argparse
import sys


def _info() -> int:
    import torch

    import torch_fl

    print(f"torch_fl      {torch_fl.__version__}")
    print(f"torch         {torch.__version__}")
    print(f"driver        {torch_fl.driver()}")
    print(f"devices       {torch.flagos.device_count()}")
    print(f"backends      {', '.join(torch_fl.routing.available_backends())}")
    print(f"FlagGems      {'enabled' if torch_fl.is_flaggems_enabled() else 'not available'}")
    if torch_fl.flaggems.cpp_ops():
        state = "on" if torch_fl.flaggems.cpp_enabled() else "off"
        print(f"FlagGems C++  {state}: {len(torch_fl.flaggems.cpp_ops())} operators launched from "
              f"C++ (python -m torch_fl routes shows which path each one took)")
    if torch_fl.distributed.is_available():
        inner = "nccl" if torch_fl.driver() == "cuda" else "gloo"
        print(f"distributed   c10d backend '{torch_fl.distributed.BACKEND_NAME}' over {inner}")
    else:
        print("distributed   not available (torch without torch.distributed)")
    print(f"config        {torch_fl.routing.config_path() or '(none)'}")
    return 0


def _routes(op) -> int:
    import torch_fl

    rows = torch_fl.routing.table(op)
    if not rows:
        print("no routes" + (f" for {op}" if op else "") +
              " yet: operators are routed on their first call; configured ones are listed")
        return 0
    width = max(len(r.op) for r in rows)
    for r in rows:
        state = "" if r.resolved else "  (configured, not called yet)"
        fb = "  [cpu fallback]" if r.cpu_fallback else ""
        backend = f"{r.backend} [{r.via}]" if r.via else r.backend
        print(f"{r.op:<{width}}  {backend:<18} {r.source}{fb}{state}")
    return 0


def _check_config(path) -> int:
    import torch_fl

    problems = torch_fl.routing.check_config(path)
    for p in problems:
        print(p)
    print(f"{path}: {'OK' if not problems else f'{len(problems)} error(s)'}")
    return 1 if problems else 0


def _tune(a) -> int:
    import os

    from torch_fl import tuning

    command = list(a.command)
    if command and command[0] == "--":
        command = command[1:]
    data = a.data or os.path.join(os.path.dirname(a.out), "tune-data.json")
    return tuning.run_cli(command, a.out, data, a.verify, a.budget_ms, a.max_iters)


def _report(a) -> int:
    from torch_fl import report

    try:
        out = report.build(a.source, a.out)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 1
    except (KeyError, TypeError) as e:  # a data file of the right format missing or mistyping a field
        print(f"report: {a.source!r} is not a run-data file torch_fl wrote (bad or missing field: {e})",
              file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fl", description="torch_fl tools")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, driver, devices, FlagGems, config path")
    routes = sub.add_parser("routes", help="the resolved routing table")
    routes.add_argument("--op", help="only this operator (name or name.overload)")
    check = sub.add_parser("check-config", help="validate a routing config file")
    check.add_argument("file")
    tune = sub.add_parser(
        "tune", help="route each operator to its fastest correct backend, measured on a workload",
        description="Runs the workload once with every routed call recorded; the first call of "
                    "each signature is measured on every backend of this driver and checked "
                    "against the reference kernels; writes a backends.conf with the evidence.")
    tune.add_argument("--out", default="backends.conf", help="the config to write (backends.conf)")
    tune.add_argument("--data", help="the measurements, for `report` (default: tune-data.json "
                                     "beside --out)")
    tune.add_argument("--verify", action="store_true",
                      help="also shadow-verify every call (FLAGOS_VERIFY=1); a backend whose "
                           "calls diverge is not chosen")
    tune.add_argument("--budget-ms", type=float, default=10.0,
                      help="timing budget per signature and backend (default 10)")
    tune.add_argument("--max-iters", type=int, default=100,
                      help="calls per timed batch, at most (default 100)")
    tune.add_argument("command", nargs=argparse.REMAINDER,
                      help="-- then the workload's command line, e.g. -- python train.py")
    rep = sub.add_parser("report", help="an HTML or Markdown routing report with a plot")
    rep.add_argument("--from", dest="source", default="tune-data.json",
                     help="a data file: tune's (tune-data.json) or FLAGOS_REPORT's")
    rep.add_argument("--out", default="report.html",
                     help="report.html or report.md (report.png: the plot alone)")
    args = parser.parse_args(argv)
    if args.cmd in (None, "info"):
        return _info()
    if args.cmd == "routes":
        return _routes(args.op)
    if args.cmd == "tune":
        return _tune(args)
    if args.cmd == "report":
        return _report(args)
    return _check_config(args.file)


if __name__ == "__main__":
    sys.exit(main())
