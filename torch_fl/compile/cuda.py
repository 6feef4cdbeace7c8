"""Inductor backend for flagos on the cuda driver: Inductor's Triton backend.

On this driver flagos memory is CUDA memory, flagos streams are CUDA streams
and flagos device N is CUDA device N, so the Triton kernels Inductor writes for
CUDA are the right kernels for flagos tensors. They are generated as CUDA
kernels (torch_fl/compile/_native.py): the device properties handed to Triton
say "cuda", and the wrapper launches them on the current CUDA stream, which is
the current flagos stream.
"""

from torch._inductor import config
from torch._inductor.codegen.common import BackendFeature, register_device_op_overrides
from torch._inductor.codegen.cuda.device_op_overrides import CUDADeviceOpOverrides
from torch._inductor.codegen.triton import TritonScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.virtualized import V

from . import _compat, _native, cpp_wrapper


@_native.generate_for("cuda", with_index=True)
class FlagosTritonScheduling(TritonScheduling):
    """TritonScheduling whose kernels and launches are generated as CUDA ones.

    Triton GEMM templates are left out: their code takes its device from the
    output buffer (flagos), which Triton has no target for, so matmuls stay
    ATen calls, which go through flagos routing (cuBLAS or FlagGems).
    """

    @classmethod
    def get_backend_features(cls, device):
        features = super().get_backend_features(device)
        return type(features)(f for f in features if f != BackendFeature.TRITON_TEMPLATES)


def _cudagraph_skip_reason():
    """Why this graph must not be captured, or None (read at code generation)."""
    graph = V.graph
    others = set(graph.device_types) - {"flagos", "meta"}
    if others:
        return f"it also has {', '.join(sorted(others))} tensors"
    if getattr(graph, "disable_cudagraphs_reason", None):
        return graph.disable_cudagraphs_reason
    node = _compat.first_incompatible_cudagraph_node(graph.orig_gm)
    if node is not None:
        return f"incompatible op {node.target}"
    return None


class FlagosCudaWrapperCodegen(_PythonWrapperCodegen):
    """Inductor's Python wrapper; with CUDA graphs on, its ``call`` replays a captured graph."""

    @staticmethod
    def create(is_subgraph, *args, **kwargs):
        if is_subgraph:
            return _PythonWrapperCodegen.create(is_subgraph, *args, **kwargs)
        return FlagosCudaWrapperCodegen()

    def generate_end(self, result) -> None:
        super().generate_end(result)
        if not config.triton.cudagraphs:
            return
        reason = _cudagraph_skip_reason()
        if reason is not None:
            _compat.log_cudagraph_skip(f"skipping CUDA graphs for a flagos graph: {reason}")
            return
        graph = V.graph
        mutated = [i for i, name in enumerate(graph.graph_input_names) if name in graph.mutated_inputs]
        device_index = next(iter(graph.device_idxs), 0)
        result.splice(
            f"""
            from torch_fl.compile.cudagraphs import GraphedCall as _FlagosGraphedCall
            call = _FlagosGraphedCall(call, mutated_input_idxs={tuple(mutated)!r}, device_index={device_index})
            """
        )


Scheduling = FlagosTritonScheduling
PythonWrapperCodegen = FlagosCudaWrapperCodegen
CppWrapperCodegen = cpp_wrapper.cuda_wrapper()  # cpp_wrapper=True and AOTInductor
WrapperFxCodegen = None


def register() -> None:
    cpp_wrapper.register()
    # CUDA's device switching and raw stream: flagos device N and its current
    # stream are CUDA device N's on this driver.
    register_device_op_overrides("flagos", CUDADeviceOpOverrides())
    _compat.register_backend(
        "flagos", Scheduling, PythonWrapperCodegen, CppWrapperCodegen, WrapperFxCodegen,
        custom_pass=_native.CacheKeyPass("cuda"),
    )
