"""Inductor backend for flagos on the host driver: Inductor's C++ (CPU) backend.

Host-driver memory is host memory, so the C++ kernels Inductor writes for the
CPU read and write flagos tensors in place (through their data pointers).
"""

from torch._inductor.codegen.common import register_device_op_overrides
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
from torch._inductor.codegen.wrapper import PythonWrapperCodegen as _PythonWrapperCodegen
from torch._inductor.codegen.wrapper import (
    SubgraphPythonWrapperCodegen as _SubgraphPythonWrapperCodegen,
)

from . import _compat, _native, cpp_wrapper, host_decisions


@_native.generate_for("cpu", with_index=False)
class FlagosCppScheduling(CppScheduling):
    """CppScheduling whose kernels and kernel calls are generated as CPU ones."""


class HostDeviceOpOverrides(CpuDeviceOpOverrides):
    """Device switching in the generated wrapper goes through torch.flagos; no streams."""

    def set_device(self, device_idx: int) -> str:
        return f"torch.flagos.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.flagos.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.flagos.device({device_idx})"


class _IndexedAllocations:
    """Buffers name their flagos device index.

    Inductor allocates buffers by device type and relies on a device guard for
    the index, but emits guards only for GPU types. Host-driver devices are not
    GPUs (their kernels are C++), so the index goes into the allocation itself:
    in the main graph and in every subgraph (torch.cond's branches, while_loop's
    body, nested_compile_region), whose buffers are on the same device.
    """

    def make_allocation(self, name, device, *args, **kwargs):
        line = super().make_allocation(name, device, *args, **kwargs)
        if device.type == "flagos" and device.index is not None:
            line = line.replace("device='flagos'", f"device='flagos:{device.index}'", 1)
        return line


class FlagosHostSubgraphWrapperCodegen(_IndexedAllocations, _SubgraphPythonWrapperCodegen):
    """Inductor's wrapper for a subgraph, with indexed allocations."""


class FlagosHostWrapperCodegen(_IndexedAllocations, _PythonWrapperCodegen):
    """Inductor's Python wrapper, with indexed allocations."""

    @staticmethod
    def create(is_subgraph, subgraph_name=None, parent_wrapper=None, *args, **kwargs):
        if is_subgraph:
            return FlagosHostSubgraphWrapperCodegen(subgraph_name, parent_wrapper, *args, **kwargs)
        return FlagosHostWrapperCodegen()


# The names Inductor reads from the device module (torch.flagos.Scheduling, ...).
Scheduling = FlagosCppScheduling
PythonWrapperCodegen = FlagosHostWrapperCodegen
CppWrapperCodegen = cpp_wrapper.host_wrapper()  # cpp_wrapper=True and AOTInductor
WrapperFxCodegen = None


def register() -> None:
    cpp_wrapper.register()
    register_device_op_overrides("flagos", HostDeviceOpOverrides())
    _compat.register_backend(
        "flagos", Scheduling, PythonWrapperCodegen, CppWrapperCodegen, WrapperFxCodegen,
        custom_pass=_native.CacheKeyPass("host"),
    )
    _compat.disable_simd_only_loop_transforms()
    host_decisions.install()
