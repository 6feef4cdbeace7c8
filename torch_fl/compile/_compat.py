"""Every difference between the torch versions we build against (2.11 on the GPU
machine, 2.13 and 2.14 in CI) that the compile support meets, in one place.

Features are detected, not keyed on version numbers: a name either exists in
the installed torch or it does not.
"""

import inspect

import torch


def add_gpu_type(device_type: str) -> None:
    """Makes Inductor's ``is_gpu(device_type)`` true (Triton codegen, device guards, streams).

    PyTorch has no registration for GPU types: ``is_gpu`` is a membership test
    on the module list ``torch._inductor.utils.GPU_TYPES``. ``get_gpu_type()``
    (cached) asserts that at most one listed type is available; it is resolved
    first, while only CUDA is listed, so it keeps answering "cuda", which is
    the right answer for what it is used for (autotune subprocesses, comm
    estimates), since flagos devices are CUDA devices on this driver.
    """
    from torch._inductor import utils

    utils.get_gpu_type()
    if device_type not in utils.GPU_TYPES:
        utils.GPU_TYPES.append(device_type)


# Scheduler transformations that Inductor applies to every non-CPU device and
# skips for CPU (`BaseSchedulerNode.is_cpu()`), because they assume the SIMD
# (Triton) node grouping. C++ kernels group differently; on them these crash
# (TypeError in _try_reindex_pointwise_for_reduction) or were never validated.
_SIMD_ONLY_LOOP_TRANSFORMS = (
    "loop_ordering_after_fusion",
    "loop_reindexing_after_fusion",
    "loop_index_inversion_in_fusion",
)


def disable_simd_only_loop_transforms() -> list:
    """Turns off, in Inductor's config, the transformations CPU kernels never get.

    Returns the names set (those this torch has). They are no-ops for CPU
    nodes, so on a CPU build of torch only flagos graphs see the change.
    """
    from torch._inductor import config

    changed = []
    for name in _SIMD_ONLY_LOOP_TRANSFORMS:
        if hasattr(config, name) and getattr(config, name):
            setattr(config, name, False)
            changed.append(name)
    return changed


def register_backend(device: str, scheduling, wrapper, cpp_wrapper=None, fx_wrapper=None,
                     custom_pass=None) -> None:
    """``register_backend_for_device`` with the keywords this torch accepts."""
    from torch._inductor.codegen.common import register_backend_for_device

    params = inspect.signature(register_backend_for_device).parameters
    kwargs = {}
    if "device_fx_wrapper_codegen" in params:
        kwargs["device_fx_wrapper_codegen"] = fx_wrapper
    if custom_pass is not None and "device_custom_pass" in params:
        kwargs["device_custom_pass"] = custom_pass
    register_backend_for_device(device, scheduling, wrapper, cpp_wrapper, **kwargs)


def cache_key_pass_base():
    """Base class of a post-grad pass whose ``uuid()`` enters Inductor's cache key."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphModulePass

        return CustomGraphModulePass
    except ImportError:  # older torch: a plain callable is still run, not hashed
        return object


def codegen_entry_points(scheduling_cls) -> list:
    """The Scheduling methods that generate kernels or their calls, as this torch names them."""
    names = (
        "codegen_node",
        "codegen_template",
        "codegen_combo_kernel",
        "codegen_mix_order_reduction",
        "codegen_nested_reduction",
        "codegen_sync",
        "flush",
        "generate_kernel_code_from_nodes",
        "benchmark_fused_nodes",
        "benchmark_codegened_module",
        "benchmark_combo_kernel",
    )
    return [n for n in names if callable(getattr(scheduling_cls, n, None))]


def first_incompatible_cudagraph_node(gm):
    """The first node CUDA graphs cannot capture (a CPU sync, an unsafe op), or None."""
    from torch._inductor import utils

    fn = getattr(utils, "get_first_incompatible_cudagraph_node", None)
    return fn(gm) if fn is not None else None


def cudagraph_input_is_static(t: torch.Tensor) -> bool:
    """Whether Inductor would treat graph input ``t`` as having a fixed address.

    Parameters, and tensors Dynamo marked static (module buffers it inlined,
    ``torch._dynamo.mark_static_address``, e.g. a static KV cache).
    """
    return isinstance(t, torch.nn.Parameter) or hasattr(t, "_dynamo_static_input_type")


def log_cudagraph_skip(message: str) -> None:
    """Reports a graph that runs without CUDA graphs the way Inductor reports its own skips."""
    try:
        from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter
    except ImportError:
        from torch._dynamo.utils import counters

        counters["inductor"]["cudagraph_skips"] += 1
        return
    log_cudagraph_skip_and_bump_counter(message)


def data_ptrs_equal(tensors: list, ptrs: list, indices: list) -> bool:
    """Whether ``tensors[i].data_ptr() == ptrs[i]`` for every i in ``indices`` (in C++ where torch has it)."""
    fn = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if fn is not None:
        return fn(tensors, ptrs, indices)
    return all(tensors[i].data_ptr() == ptrs[i] for i in indices)
