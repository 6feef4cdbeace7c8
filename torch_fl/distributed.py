"""torch.distributed on flagos: the ``flagos`` c10d backend (docs/distributed.md).

Importing torch_fl registers the backend with torch.distributed's documented
extension point, ``Backend.register_backend``. Then

    dist.init_process_group()                            # picks it for flagos
    dist.init_process_group("flagos")
    dist.init_process_group("cpu:gloo,flagos:flagos")

all give a process group whose flagos tensors go to ``ProcessGroupFlagos``
(csrc/distributed/) and whose CPU tensors go to gloo, so stock DDP, FSDP2,
DeviceMesh, DTensor, torch.distributed.checkpoint and torchrun work unchanged.

``ProcessGroupFlagos`` runs an inner backend on zero-copy native views of
flagos tensors: gloo on the host driver, NCCL on the cuda driver.
"""

import os
import threading

import torch

from . import _C, _wrap

BACKEND_NAME = "flagos"

# The torch.distributed differences this module handles.
_TORCH = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
# 2.14 made Backend._set_sequence_number_for_group a deprecated no-op.
_SETS_SEQUENCE_NUMBERS = _TORCH < (2, 14)


def is_available() -> bool:
    """Whether this torch has torch.distributed and torch_fl was built with the backend."""
    return torch.distributed.is_available() and _C._distributed.available


# How the group being built asked for flagos, set by BackendConfig (below) in
# the thread that then calls the creator: "explicit" ("flagos" named),
# "accelerator" (a bare init_process_group(): flagos as the machine's
# accelerator) or "library" ("gloo", "nccl": flagos added for its tensors).
_request = threading.local()


def _map_local_rank_to_device(request: str) -> None:
    # torchrun sets LOCAL_RANK; as DeviceMesh does for CUDA, it picks this
    # process's device unless the program has already used the device. Only
    # where the program asked for flagos: a group named after a library
    # ("gloo", "nccl") gains flagos for its tensors, but a CPU or CUDA program
    # asking for it must find its process as it was (no flagos device set, no
    # refusal of a LOCAL_RANK beyond flagos' devices).
    local_rank = os.environ.get("LOCAL_RANK")
    if request == "library" or local_rank is None or torch.flagos.is_initialized():
        return
    try:
        index = int(local_rank)
    except ValueError:
        return  # torchrun's own variable, malformed by hand: torch.distributed's to judge
    count = torch.flagos.device_count()
    if index >= count:
        if request == "accelerator":
            return  # a bare init in a program that may not use flagos at all (CPU-only, autoload)
        raise RuntimeError(
            f"LOCAL_RANK={index} but this process sees {count} flagos device(s) "
            f"(flagos:0..{count - 1}); start at most {count} processes per node, or raise "
            "FLAGOS_HOST_DEVICES on the host driver"
        )
    torch.flagos.set_device(index)


def _inner_backend(store, rank, size, timeout, group_name, global_ranks, gloo, backend_options):
    """The backend that runs flagos collectives on native views."""
    from torch.distributed import PrefixStore

    if _C._driver_name() != "cuda":
        return gloo  # host driver: flagos memory is host memory; share one gloo context
    from torch.distributed import ProcessGroupNCCL

    if backend_options is not None and not isinstance(backend_options, ProcessGroupNCCL.Options):
        raise TypeError(
            "pg_options for the flagos backend on the cuda driver must be "
            f"ProcessGroupNCCL.Options, not {type(backend_options).__name__}"
        )
    options = backend_options or ProcessGroupNCCL.Options()
    if backend_options is None:
        options.is_high_priority_stream = False
    options._timeout = timeout
    options.global_ranks_in_group = global_ranks
    options.group_name = group_name
    nccl = ProcessGroupNCCL(PrefixStore("nccl/", store), rank, size, options)
    if _SETS_SEQUENCE_NUMBERS:
        nccl._set_sequence_number_for_group()
    return nccl


def _create_process_group(opts, backend_options):
    """The creator registered with ``Backend.register_backend(extended_api=True)``.

    It returns a whole ProcessGroup (which torch.distributed takes in place of
    the one it was building) with two backends: gloo for CPU tensors, flagos
    for flagos tensors. A bare ``init_process_group()`` builds only the
    accelerator's backend and makes gloo the group's default; answering with
    both keeps CPU collectives, object collectives and DDP working there.
    """
    from torch.distributed import PrefixStore, ProcessGroup, ProcessGroupGloo

    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    group_name, global_ranks = opts.group_id, list(opts.global_ranks_in_group)
    _map_local_rank_to_device(getattr(_request, "kind", "explicit"))

    try:
        gloo = ProcessGroupGloo(PrefixStore("gloo/", store), rank, size, timeout=timeout)
    except RuntimeError as e:
        raise RuntimeError(
            f"flagos backend: rank {rank} could not reach the other ranks of a group of "
            f"{size} within {timeout} ({e}). Check that world_size ({size}) is the number "
            "of processes started and that all of them called init_process_group / new_group"
        ) from e
    if hasattr(gloo, "options"):  # as torch's own helper fills them
        gloo.options.global_ranks_in_group = global_ranks
        gloo.options.group_name = group_name
    if _SETS_SEQUENCE_NUMBERS:
        gloo._set_sequence_number_for_group()
    inner = _inner_backend(
        store, rank, size, timeout, group_name, global_ranks, gloo, backend_options
    )
    flagos = _C._distributed._bind()(inner, rank, size, timeout)

    pg = ProcessGroup(store, rank, size)
    pg._set_default_backend(ProcessGroup.BackendType.GLOO)
    pg._register_backend(torch.device("cpu"), ProcessGroup.BackendType.GLOO, gloo)
    pg._register_backend(torch.device("flagos"), ProcessGroup.BackendType.CUSTOM, flagos)
    return pg


def register() -> None:
    """Registers the ``flagos`` backend with torch.distributed (idempotent)."""
    if not is_available():
        return
    import torch.distributed as dist

    dist.Backend.register_backend(
        BACKEND_NAME, _create_process_group, extended_api=True, devices=["flagos", "cpu"]
    )
    _wrap.wrap_once(dist.distributed_c10d.BackendConfig, "__init__", _with_flagos_devices)


def _with_flagos_devices(init):
    """BackendConfig for one backend named alone ("gloo", "nccl"): its devices, and flagos.

    PyTorch maps such a name to the devices it lists (gloo: cpu and cuda), so a
    flagos tensor found "no backend type associated with device type flagos",
    where the CUDA tensors of the same program work under gloo; and FSDP2's
    default mesh (the accelerator's device type) failed in a gloo group. flagos
    tensors take the flagos backend there, which runs that collective library
    inside (gloo on the host driver, NCCL on the cuda driver).
    """

    import torch.distributed as dist

    def __init__(self, backend):
        init(self, backend)
        name = str(backend).lower()
        if name == dist.Backend.UNDEFINED:
            _request.kind = "accelerator"
            self.device_backend_map.setdefault("flagos", dist.Backend(BACKEND_NAME))
        elif name in dist.Backend.backend_list and "flagos" not in self.device_backend_map:
            self.device_backend_map["flagos"] = dist.Backend(BACKEND_NAME)
            _request.kind = "library"
        else:
            _request.kind = "explicit"

    return __init__
