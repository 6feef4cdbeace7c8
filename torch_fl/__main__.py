"""python -m torch_fl: inspect the installation and the routing configuration.

    python -m torch_fl info
    python -m torch_fl routes [--op NAME]
    python -m torch_fl check-config FILE
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_fl", description="torch_fl tools")
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("info", help="versions, driver, devices, FlagGems, config path")
    routes = sub.add_parser("routes", help="the resolved routing table")
    routes.add_argument("--op", help="only this operator (name or name.overload)")
    check = sub.add_parser("check-config", help="validate a routing config file")
    check.add_argument("file")
    args = parser.parse_args(argv)
    if args.cmd in (None, "info"):
        return _info()
    if args.cmd == "routes":
        return _routes(args.op)
    return _check_config(args.file)


if __name__ == "__main__":
    sys.exit(main())
