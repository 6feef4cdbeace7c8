"""torch.flagos calls inside compiled functions: Dynamo's rules for them.

Dynamo traces Python only, and torch_fl's device functions end in its extension
module, so ``torch.flagos.is_available()``, ``with torch.flagos.stream(s):`` or
``with torch.flagos.device(1):`` in a compiled function broke the graph (and
failed under ``fullgraph=True``), where their torch.cuda counterparts compile.
Dynamo keeps what it knows about torch.cuda in tables; :func:`install` adds
torch.flagos to them. A table a torch version lacks is skipped: there the call
still breaks the graph, as before.

- Constant folding (``variables.torch.constant_fold_functions``):
  ``is_available()`` and ``device_count()``, whose answers are fixed for the
  life of the process and take no device, are evaluated while tracing, as
  ``torch.cuda.is_available`` is. The queries that take a device (name,
  capability, properties, bf16 support) are not: a folded call that raises
  (a bad index, the host driver's capability) fails the compile where eager
  code could catch it, an index that turns dynamic cannot be folded, and no
  guard would follow the current device.
- Trace rules (``trace_rules.manual_torch_name_rule_map``): those two and, on
  the cuda driver, ``torch.flagos.stream`` are torch functions that Dynamo
  handles itself. ``stream(s)`` then becomes a stream context through Dynamo's
  handler for the device interfaces' ``stream`` (compile/device_interface.py
  registers ours), and ``Stream()`` and ``current_stream()`` give Dynamo
  torch.Streams while compiling (flagos/streams.py). Not on the host driver:
  Inductor defines a graph's streams only under a GPU device guard, which a
  host-driver graph (C++ kernels, as the CPU's) never enters, so its code would
  name undefined streams; compiled CPU code with ``torch.Stream(device="cpu")``
  fails the same way in torch 2.13. There ``stream`` is marked skipped: the
  graph breaks before its context is entered.
- Device context managers (``register_device_context_manager``, torch 2.13 and
  later): ``torch.flagos.device(i)`` switches the device as
  ``torch.cuda.device(i)`` does. Each switch clears FakeTensor's dispatch
  cache, whose keys leave the current device out (pytorch/pytorch#197583):
  with two contexts in one graph, a factory call naming no index was answered
  with the other device's tensor.
- Frames run as plain Python (``eval_frame``'s code strategies): the stream
  and device switches, and everything they call. Code that a graph break
  leaves to run eagerly still has its Python calls compiled as frames of their
  own; a compiled frame of set_stream() holds torch.accelerator.set_stream as
  a graph node, which Dynamo and AOTAutograd also run while tracing, and
  Dynamo answers current_stream(device) with the current device's stream. The
  side stream of a ``with torch.flagos.stream(s)`` stayed current after the
  compiled function returned.

``current_device()``, ``synchronize()`` and ``current_stream()`` need none of
this: while compiling they call torch.accelerator's, which Dynamo knows
(flagos/_device.py, flagos/streams.py).
"""

from .. import _C, flagos
from ..flagos._device import _device_index

_FOLDED = ("is_available", "device_count")


def _exchange_device(index: int) -> int:
    from torch._subclasses.fake_tensor import FakeTensorMode

    FakeTensorMode.cache_clear()
    return _C._exchange_device(index)


def _device_variable_class(generic):
    class FlagosDeviceVariable(generic):
        """``torch.flagos.device(i)`` in a compiled function."""

        _exchange_fn = staticmethod(_exchange_device)
        # Exchanging to -1 leaves the device as it is, which is what the
        # "maybe" variant of CUDA's does.
        _maybe_exchange_fn = staticmethod(_exchange_device)
        _get_device_index_fn = staticmethod(_device_index)

        def module_name(self) -> str:
            return "torch.flagos"

        def python_type(self) -> type:
            return flagos.device

    return FlagosDeviceVariable


def install() -> None:
    """Adds torch.flagos to Dynamo's tables (idempotent)."""
    from torch._dynamo import eval_frame, trace_rules
    from torch._dynamo.variables import ctx_manager
    from torch._dynamo.variables import torch as torch_variables

    on_cuda = flagos._device._on_cuda()
    rules = getattr(trace_rules, "manual_torch_name_rule_map", None)
    if isinstance(rules, dict):
        for name in _FOLDED:
            rules[f"torch.flagos.{name}"] = torch_variables.TorchInGraphFunctionVariable
        rules["torch.flagos.stream"] = (torch_variables.TorchInGraphFunctionVariable if on_cuda
                                        else trace_rules.SkipFunctionVariable)
        trace_rules.get_torch_obj_rule_map.cache_clear()  # built once, maybe already
    folded = getattr(torch_variables, "constant_fold_functions", None)
    if isinstance(folded, dict):
        for name in _FOLDED:
            folded[getattr(flagos, name)] = None
    _run_as_python(eval_frame, (flagos.set_stream, flagos.streams.StreamContext.__enter__,
                                flagos.streams.StreamContext.__exit__, flagos.device.__enter__,
                                flagos.device.__exit__))
    register = getattr(ctx_manager, "register_device_context_manager", None)
    generic = getattr(ctx_manager, "GenericDeviceVariable", None)
    if register is not None and generic is not None:
        if ctx_manager.get_device_context_manager(flagos.device) is None:
            register(flagos.device, _device_variable_class(generic))


def _run_as_python(eval_frame, functions) -> None:
    """Dynamo never compiles these functions' frames, nor the frames they call."""
    strategy = getattr(eval_frame, "set_code_exec_strategy", None)
    try:
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        strategy = None
    for fn in functions:
        if strategy is not None:
            strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
        elif hasattr(eval_frame, "skip_code"):  # the frame itself only
            eval_frame.skip_code(fn.__code__)
