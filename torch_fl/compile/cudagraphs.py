"""``mode="reduce-overhead"`` on the cuda driver: compiled flagos graphs replayed as CUDA graphs.

Inductor wraps compiled code in CUDA graphs only when the graph's single
device has type "cuda" (cudagraph_utils.check_multiple_devices_or_any_cpu_nodes)
and its graph trees rebuild outputs as CUDA tensors, so neither applies to
flagos. Instead the flagos wrapper codegen (cuda.py) ends the generated module
with ``call = GraphedCall(call, ...)`` when CUDA graphs are on in Inductor's
config, which is what ``mode="reduce-overhead"`` sets.

Per input signature (the integer arguments, which carry the dynamic sizes,
and the addresses of static inputs), the first call runs normally: Triton
kernels compile and autotune there, which cannot happen during a capture.
The second call captures, with ``torch.flagos.graph``, into a private memory
pool; later calls copy the inputs that are not static into the captured input
buffers and replay. Static inputs (parameters, and tensors Dynamo marked
static: module buffers, ``torch._dynamo.mark_static_address`` such as a static
KV cache) are read and written in place.

Results keep eager semantics, unlike Inductor's own CUDA graphs: outputs
allocated from the graph's pool are copied out (views keep their layout), so
they stay valid after the next replay; outputs that are views of inputs are
views of the caller's tensors; inputs the graph mutates are written back.
"""

import collections
import warnings

import torch

from ..flagos import graphs
from . import _compat

# A compiled graph seen with more input signatures than this runs uncaptured
# for new ones (each capture holds its own memory pool).
MAX_RECORDINGS = 16

# Process-wide totals: "captures", "replays", "skips" (graphs run uncaptured).
counters = collections.Counter()

_WARM = object()  # signature seen once: ran uncaptured, capture on the next call
_UNCAPTURED = object()  # capture failed or limit reached: always run uncaptured


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    _copy_into(buf, t)
    return buf


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    # An expanded (stride 0) dimension is one element in memory: copy that one.
    if 0 in dst.stride():
        index = tuple(0 if s == 0 else slice(None) for s in dst.stride())
        dst[index].copy_(src[index])
    else:
        dst.copy_(src)


class _Layout:
    """Which arguments of a compiled call are tensors, static tensors, or scalars (fixed per graph)."""

    def __init__(self, args):
        self.scalars = [i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)]
        tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        self.static = [i for i in tensors if _compat.cudagraph_input_is_static(args[i])]
        self.copied = [i for i in tensors if i not in set(self.static)]

    def key(self, args) -> tuple:
        return (tuple(_scalar_key(args[i]) for i in self.scalars),
                tuple(args[i].data_ptr() for i in self.static))


def _scalar_key(v):
    return v if isinstance(v, (int, float, bool, str, type(None))) else type(v)


class _Recording:
    """One captured graph of a compiled call and the buffers it reads and writes."""

    def __init__(self, call, args, layout: _Layout, mutated_input_idxs, device_index):
        self.layout = layout
        self.scalar_values = [args[i] for i in layout.scalars]
        self.static_ptrs = [None] * len(args)
        for i in layout.static:
            self.static_ptrs[i] = args[i].data_ptr()
        self.inputs = list(args)
        for i in layout.copied:
            self.inputs[i] = _static_copy(args[i])
        self.write_back = [i for i in mutated_input_idxs if i in set(layout.copied)]
        self.graph = graphs.FlagosGraph()
        with torch.flagos.device(device_index), graphs.graph(self.graph):
            outputs = call(list(self.inputs))
        self.returns_sequence = isinstance(outputs, (list, tuple))
        self.outputs = tuple(outputs) if self.returns_sequence else (outputs,)
        self._plan_outputs()
        counters["captures"] += 1

    def _plan_outputs(self) -> None:
        # For each output: ("input", index) for a view of a copied input,
        # ("keep",) for a view of a static input (the caller's own tensor),
        # else ("pool", storage group): memory the next replay may rewrite
        # (a constant returned as is is copied too, which is merely safe).
        input_of = {}
        for i, t in enumerate(self.inputs):
            if isinstance(t, torch.Tensor):
                input_of.setdefault(t.untyped_storage().data_ptr(), i)
        groups = {}
        self.plan = []
        for o in self.outputs:
            if not isinstance(o, torch.Tensor):
                self.plan.append(("keep",))
                continue
            ptr = o.untyped_storage().data_ptr()
            i = input_of.get(ptr)
            if i is not None:
                self.plan.append(("keep",) if i in self.layout.static else ("input", i))
            elif ptr != 0 and o.device.type == "flagos":
                self.plan.append(("pool", groups.setdefault(ptr, len(groups))))
            else:
                self.plan.append(("keep",))
        self.pool_storages = [None] * len(groups)
        for (kind, *rest), o in zip(self.plan, self.outputs):
            if kind == "pool":
                self.pool_storages[rest[0]] = o.untyped_storage()

    def matches(self, args) -> bool:
        # The fast check of the signature _Layout.key gave this recording: the
        # same scalars and static input addresses.
        layout = self.layout
        return (all(args[i] == v for i, v in zip(layout.scalars, self.scalar_values))
                and _compat.data_ptrs_equal(args, self.static_ptrs, layout.static))

    def replay(self, args):
        for i in self.layout.copied:
            _copy_into(self.inputs[i], args[i])
        callers = list(args)
        args.clear()  # Inductor's convention: the callee releases its inputs
        self.graph.replay()
        counters["replays"] += 1
        for i in self.write_back:
            callers[i].copy_(self.inputs[i])
        copies = [s.clone() for s in self.pool_storages]  # the next replay rewrites the pool
        result = []
        for (kind, *rest), o in zip(self.plan, self.outputs):
            if kind == "pool":
                out = torch.empty((0,), dtype=o.dtype, device=o.device)
                out.set_(copies[rest[0]], o.storage_offset(), o.size(), o.stride())
                result.append(out)
            elif kind == "input":
                src, mine = callers[rest[0]], self.inputs[rest[0]]
                offset = o.storage_offset() - mine.storage_offset() + src.storage_offset()
                result.append(src.as_strided(o.size(), o.stride(), offset))
            else:
                result.append(o)
        return result if self.returns_sequence else result[0]


class GraphedCall:
    """An Inductor ``call(args)`` that replays from CUDA graphs (see the module docstring)."""

    def __init__(self, call, mutated_input_idxs=(), device_index: int = 0):
        graphs._require_cuda_driver("mode='reduce-overhead' on flagos")
        self._call = call
        self._mutated = tuple(mutated_input_idxs)
        self._device = device_index
        self._layout = None
        self._entries = {}
        self._last = None
        self._warned = False

    def __call__(self, args):
        # The cuda driver is checked in __init__: ask CUDA directly (this runs per call).
        if torch.cuda.is_current_stream_capturing():
            return self._call(args)  # inside the caller's own capture: record the kernels there
        last = self._last
        if last is not None and last.matches(args):
            return last.replay(args)
        if self._layout is None:
            self._layout = _Layout(args)
        key = self._layout.key(args)
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = _WARM
            return self._call(args)
        if entry is _UNCAPTURED:
            return self._call(args)
        if entry is _WARM:
            if sum(isinstance(e, _Recording) for e in self._entries.values()) >= MAX_RECORDINGS:
                self._skip(key, f"more than {MAX_RECORDINGS} input signatures")
                return self._call(args)
            try:
                entry = _Recording(self._call, args, self._layout, self._mutated, self._device)
            except Exception as e:  # noqa: BLE001 - capture is an optimization; say why it is off
                self._skip(key, f"capture failed: {type(e).__name__}: {e}")
                return self._call(args)
            self._entries[key] = entry
        self._last = entry
        return entry.replay(args)

    def _skip(self, key, why: str) -> None:
        self._entries[key] = _UNCAPTURED
        counters["skips"] += 1
        if not self._warned:
            self._warned = True
            warnings.warn(f"torch.compile(mode='reduce-overhead') on flagos runs this graph "
                          f"without CUDA graphs: {why}", RuntimeWarning, stacklevel=3)
