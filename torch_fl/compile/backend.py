"""``torch.compile(backend="flagos")``: the device's compiler under its own name.

Device plugins name a Dynamo backend after their device (PyTorch's reference
backend registers ``"openreg"``, torch_npu ``"npu"``), and programs written for
them pass that name. flagos' compiler is Inductor with the flagos code
generation of this package (docs/compile.md), so the ``flagos`` backend is
Inductor: ``mode`` and ``options`` mean what they mean for ``"inductor"``, and
the compiled code is the code plain ``torch.compile`` generates.

``torch.compile`` hands a named backend ``mode`` and ``options`` as keyword
arguments only when they are set (``torch._TorchCompileWrapper``), and checks
neither: Inductor's wrapper checks both when the first graph compiles, with
its own errors naming the valid choices.
"""

import sys

import torch

NAME = "flagos"


def flagos(gm, example_inputs, *, mode=None, options=None):
    """Compiles one Dynamo graph with Inductor; see the module docstring."""
    return torch._TorchCompileInductorWrapper(mode, options, dynamic=None)(gm, example_inputs)


def _reset() -> None:
    # What the "inductor" wrapper's reset() does for torch._dynamo.reset():
    # Inductor's own CUDA graph trees (CUDA tensors in a flagos program) are
    # dropped with the compiled code. Nothing to drop if never imported.
    if "torch._inductor.cudagraph_trees" in sys.modules:
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()


flagos.reset = _reset


def register() -> None:
    """Adds the backend to Dynamo's registry (once; a name taken already is left alone)."""
    from torch._dynamo.backends import registry

    if NAME not in registry._COMPILER_FNS:
        registry.register_backend(compiler_fn=flagos, name=NAME)
