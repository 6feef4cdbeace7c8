"""``mode="reduce-overhead"`` on the cuda driver: compiled flagos graphs replayed as CUDA graphs.

Inductor wraps compiled code in CUDA graphs only when the graph's single
device has type "cuda" (cudagraph_utils.check_multiple_devices_or_any_cpu_nodes)
and its graph trees rebuild outputs as CUDA tensors, so neither applies to
flagos. Instead the flagos wrapper codegen (cuda.py) ends the generated module
with ``call = GraphedCall(call, ...)`` when CUDA graphs are on in Inductor's
config, which is what ``mode="reduce-overhead"`` sets.

Per distinct input signature (shapes, strides, dtypes, integer arguments and
the addresses of static inputs), the first call runs normally: Triton kernels
compile and autotune there, which cannot happen during a capture. The second
call captures, with ``torch.flagos.graph``, into a private memory pool;
later calls copy the inputs that are not static into the captured input
buffers and replay. Static inputs (parameters, buffers and tensors Dynamo
marked static, such as a static KV cache) are read and written in place.

Results match eager semantics, unlike Inductor's own CUDA graphs: outputs
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


def _signature(args) -> tuple:
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            static = _compat.cudagraph_input_is_static(a)
            key.append((tuple(a.shape), a.stride(), a.dtype, a.device, a.storage_offset(),
                        a.data_ptr() if static else None))
        elif isinstance(a, (int, float, bool)) or a is None:
            key.append(a)
        else:
            key.append(type(a))
    return tuple(key)


def _static_copy(t: torch.Tensor) -> torch.Tensor:
    buf = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    _copy_into(buf, t)
    return buf


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    # Expanded (stride 0) dimensions are one element in memory: copy that one.
    index = tuple(0 if s == 0 and n > 1 else slice(None) for n, s in zip(dst.shape, dst.stride()))
    if index and any(i == 0 for i in index):
        dst[index].copy_(src[index])
    else:
        dst.copy_(src)


class _Recording:
    """One captured graph of a compiled call and the buffers it reads and writes."""

    def __init__(self, call, args, mutated_input_idxs, device_index):
        self.static = [isinstance(a, torch.Tensor) and _compat.cudagraph_input_is_static(a)
                       for a in args]
        self.inputs = [
            _static_copy(a) if isinstance(a, torch.Tensor) and not s else a
            for a, s in zip(args, self.static)
        ]
        self.copied = [i for i, a in enumerate(args)
                       if isinstance(a, torch.Tensor) and not self.static[i]]
        self.write_back = [i for i in mutated_input_idxs if i in set(self.copied)]
        self.graph = graphs.FlagosGraph()
        with torch.flagos.device(device_index), graphs.graph(self.graph):
            outputs = call(list(self.inputs))
        self.outputs = tuple(outputs) if isinstance(outputs, (list, tuple)) else (outputs,)
        self.returns_sequence = isinstance(outputs, (list, tuple))
        counters["captures"] += 1
        self.pool_storage_ptrs = {
            o.untyped_storage().data_ptr()
            for o in self.outputs if isinstance(o, torch.Tensor)
        } - self._input_storage_ptrs()

    def _input_storage_ptrs(self) -> set:
        return {t.untyped_storage().data_ptr() for t in self.inputs if isinstance(t, torch.Tensor)}

    def replay(self, args):
        for i in self.copied:
            _copy_into(self.inputs[i], args[i])
        written = [(args[i], self.inputs[i]) for i in self.write_back]
        callers = list(args)
        args.clear()  # Inductor's convention: the callee releases its inputs
        self.graph.replay()
        counters["replays"] += 1
        for dst, src in written:
            dst.copy_(src)
        outputs = self._detach_outputs(callers)
        return outputs if self.returns_sequence else outputs[0]

    def _detach_outputs(self, callers) -> tuple:
        by_storage = {}
        for i, t in enumerate(self.inputs):
            if isinstance(t, torch.Tensor):
                by_storage.setdefault(t.untyped_storage().data_ptr(), i)
        copies = {}
        result = []
        for o in self.outputs:
            if not isinstance(o, torch.Tensor):
                result.append(o)
                continue
            ptr = o.untyped_storage().data_ptr()
            if ptr in self.pool_storage_ptrs:
                # Pool memory is rewritten by the next replay: copy the storage
                # once per call and rebuild every output view on the copy.
                storage = copies.get(ptr)
                if storage is None:
                    storage = copies[ptr] = o.untyped_storage().clone()
                out = torch.empty((0,), dtype=o.dtype, device=o.device)
                out.set_(storage, o.storage_offset(), o.size(), o.stride())
                result.append(out)
            elif ptr in by_storage:
                i = by_storage[ptr]
                if self.static[i]:
                    result.append(o)  # a view of the caller's own tensor
                else:
                    src, mine = callers[i], self.inputs[i]
                    offset = o.storage_offset() - mine.storage_offset() + src.storage_offset()
                    result.append(src.as_strided(o.size(), o.stride(), offset))
            else:
                result.append(o)  # memory outside the graph (a constant): not rewritten
        return tuple(result)


class GraphedCall:
    """An Inductor ``call(args)`` that replays from CUDA graphs (see the module docstring)."""

    def __init__(self, call, mutated_input_idxs=(), device_index: int = 0):
        graphs._require_cuda_driver("mode='reduce-overhead' on flagos")
        self._call = call
        self._mutated = tuple(mutated_input_idxs)
        self._device = device_index
        self._entries = {}
        self._warned = False

    def __call__(self, args):
        key = _signature(args)
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
                entry = self._entries[key] = _Recording(self._call, args, self._mutated, self._device)
            except Exception as e:  # noqa: BLE001 - capture is an optimization; say why it is off
                self._skip(key, f"capture failed: {type(e).__name__}: {e}")
                return self._call(args)
        return entry.replay(args)

    def _skip(self, key, why: str) -> None:
        self._entries[key] = _UNCAPTURED
        counters["skips"] += 1
        if not self._warned:
            self._warned = True
            warnings.warn(f"torch.compile(mode='reduce-overhead') on flagos runs this graph "
                          f"without CUDA graphs: {why}", RuntimeWarning, stacklevel=3)
