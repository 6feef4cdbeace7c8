"""What a run leaves behind for ``python -m torch_fl tune`` and ``report``.

One JSON document per process: the routing table and call counts, and, when
they were on, host time per operator (FLAGOS_REPORT), verification records
(FLAGOS_VERIFY) and tuning records (FLAGOS_TUNE). :func:`merge` combines the
documents of several processes of one workload.
"""

import datetime
import json
import os
import sys

FORMAT = "torch_fl-run-data"
VERSION = 1


def snapshot(kind: str) -> dict:
    """This process's routing data; ``kind`` is ``"run"`` or ``"tune"``."""
    import torch

    import torch_fl
    from . import _C, routing, verify

    driver = torch_fl.driver()
    device_name = "CPU (host driver)"
    if driver == "cuda":
        try:
            device_name = torch.cuda.get_device_name(torch.flagos.current_device())
        except Exception:  # noqa: BLE001  (a name is only decoration)
            device_name = "CUDA device"
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "pid": os.getpid(),
        "argv": list(sys.argv),
        "driver": driver,
        "device_name": device_name,
        "torch": str(torch.__version__),
        "torch_fl": torch_fl.__version__,
        "backends": routing.available_backends(),
        "flaggems_enabled": torch_fl.is_flaggems_enabled(),
        "reference": verify.reference_backend(),
        "config": routing.config_path(),
        "env_routes": {k: v for k, v in os.environ.items() if k.startswith("FLAGOS_OP_")},
        "table": [r._asdict() for r in routing.table()],
        "stats": [s._asdict() for s in routing.stats()],
        "profile": list(_C._profile_records()),
        "verify": {"mode": verify.mode(), "records": [r._asdict() for r in verify.records()]},
        "signatures": list(_C._tune_records()),
    }


def save(data: dict, path: str) -> None:
    """Writes a data file: a regular file is replaced whole (a reader never sees
    half of it); through a symlink, its target is; a FIFO or device (`/dev/stdout`)
    is written into, never replaced by a file."""
    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def check_writable(path: str, what: str) -> None:
    """Raises ValueError naming `what` unless save(..., path) can write there: checked
    when the run starts, not when it ends (atexit)."""
    path = os.path.realpath(path)
    try:
        if os.path.exists(path) and not os.path.isfile(path):
            if not os.access(path, os.W_OK):
                raise PermissionError(f"{path!r} is not writable")
            return
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w"):
            pass
        os.remove(tmp)
    except OSError as e:
        raise ValueError(f"{what}={path!r} cannot be written ({e}): name a file in a writable "
                         "directory") from None


def load(path: str) -> dict:
    """Reads a data file, checking that it is one."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no data file {path!r}: run `python -m torch_fl tune -- python your_script.py` "
            "(it writes tune-data.json) or run your program with FLAGOS_REPORT=run.json, "
            "then pass that file") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path!r} is not a torch_fl data file: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a torch_fl data file (written by FLAGOS_REPORT or "
                         "python -m torch_fl tune)")
    if data.get("version") != VERSION:
        raise ValueError(f"{path!r} has data format version {data.get('version')}; this "
                         f"torch_fl reads version {VERSION}")
    return data


def merge(parts: list) -> dict:
    """One document from those of several processes: calls add up; each
    signature keeps the first measurement made of it."""
    if len(parts) == 1:
        return parts[0]
    parts = sorted(parts, key=lambda p: p.get("pid", 0))
    out = dict(parts[0])
    sigs, order = {}, []
    for p in parts:
        for s in p["signatures"]:
            key = (s["op"], s["signature"])
            if key not in sigs:
                sigs[key] = dict(s)
                order.append(key)
            else:
                sigs[key]["calls"] += s["calls"]
                if not sigs[key]["results"] and s["results"]:
                    sigs[key]["results"] = s["results"]
                    sigs[key]["skipped"] = s["skipped"]
    out["signatures"] = [sigs[k] for k in order]

    def add_up(key, fields, numbers):
        rows = {}
        for p in parts:
            for r in p[key] if key != "verify" else p["verify"]["records"]:
                k = tuple(r[f] for f in fields)
                if k not in rows:
                    # Copies the nested dicts too: the sums must not change the parts.
                    rows[k] = {f: dict(v) if isinstance(v, dict) else v for f, v in r.items()}
                else:
                    kept = rows[k]
                    # Verification: the first failure (and skip reason) of whichever
                    # part had one, not the empty text of a part that had none.
                    if key == "verify" and not kept["failed"] and r["failed"]:
                        kept["first_failure_call"] = r["first_failure_call"]
                        kept["first_failure"] = r["first_failure"]
                    if key == "verify" and not kept["skip_reason"] and r["skip_reason"]:
                        kept["skip_reason"] = r["skip_reason"]
                    for n in numbers:
                        if isinstance(r[n], dict):
                            for b, c in r[n].items():
                                rows[k][n][b] = rows[k][n].get(b, 0) + c
                        elif n.startswith("max"):
                            rows[k][n] = max(rows[k][n], r[n])
                        else:
                            rows[k][n] += r[n]
        return sorted(rows.values(), key=lambda r: tuple(r[f] for f in fields))

    out["stats"] = add_up("stats", ("op",), ("calls", "cpu_fallbacks"))
    out["profile"] = add_up("profile", ("op", "backend"), ("calls", "host_us"))
    out["verify"] = dict(parts[0]["verify"])
    out["verify"]["records"] = add_up("verify", ("op", "backend"),
                                      ("compared", "failed", "skipped", "max_abs", "max_rel"))
    out["processes"] = len(parts)
    return out
