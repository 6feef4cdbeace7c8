"""Graphs on flagos devices, shaped like torch.cuda's graphs API.

``FlagosGraph`` (``capture_begin``/``capture_end``/``replay``/``reset``/``pool``),
the ``graph`` context manager, ``graph_pool_handle`` and
``make_graphed_callables``. They need the cuda driver: there flagos streams are
CUDA streams and the flagos allocator is the CUDA caching allocator, so a
capture records every kernel launched on the capture stream, PyTorch's CUDA
kernels (the ``cuda`` route) and FlagGems' Triton kernels (the ``flaggems``
route) alike, and memory allocated during capture comes from the graph's
private pool. On any other driver each entry point raises an error naming the
driver.
"""

import gc

import torch

from .. import _C
from ._device import current_device, synchronize
from .memory import empty_cache
from .streams import Stream
from .streams import stream as _stream

__all__ = ["FlagosGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
           "make_graphed_callables"]


def _require_cuda_driver(what: str) -> None:
    driver = _C._driver_name()
    if driver != "cuda":
        raise RuntimeError(
            f"{what} needs the cuda driver: graphs record GPU work, and this process runs "
            f"flagos on the '{driver}' driver (FLAGOS_ACCELERATOR=cuda, on an NVIDIA GPU "
            "with a CUDA build of torch and of torch_fl)"
        )


def _check_flagos_stream(stream, what: str) -> None:
    if not isinstance(stream, torch.Stream) or stream.device.type != "flagos":
        raise TypeError(f"{what} must be a flagos stream (torch.flagos.Stream), got {stream!r}")


def is_current_stream_capturing() -> bool:
    """True while the current flagos stream is being captured into a graph."""
    if _C._driver_name() != "cuda":
        return False
    return torch.cuda.is_current_stream_capturing()


def graph_pool_handle():
    """A token for a private memory pool that several graphs may share (``pool=``)."""
    _require_cuda_driver("torch.flagos.graph_pool_handle")
    return torch.cuda.graph_pool_handle()


class FlagosGraph:
    """A recorded sequence of flagos work, replayed with one launch.

    The cuda driver's graphs are CUDA graphs: this holds a ``torch.cuda.CUDAGraph``
    and captures on the current flagos stream (which is a CUDA stream there).
    """

    def __init__(self, keep_graph: bool = False):
        _require_cuda_driver("torch.flagos.FlagosGraph")
        self._graph = torch.cuda.CUDAGraph(keep_graph=True) if keep_graph else torch.cuda.CUDAGraph()

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        """Starts capturing the current flagos stream (which must not be the default one)."""
        self._graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    def capture_end(self) -> None:
        self._graph.capture_end()

    def replay(self) -> None:
        """Launches the recorded work on the current flagos stream."""
        self._graph.replay()

    def reset(self) -> None:
        """Frees the graph; its memory pool is released once no other graph uses it."""
        self._graph.reset()

    def pool(self):
        """The token of this graph's memory pool, to share it with a later capture."""
        return self._graph.pool()

    def enable_debug_mode(self) -> None:
        self._graph.enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        self._graph.debug_dump(debug_path)


class graph:
    """Context manager that captures flagos work into ``flagos_graph``.

    As ``torch.cuda.graph``: it synchronizes the device, collects garbage and
    empties the allocator's cache, then captures on ``stream`` (default: a side
    stream of the current device) with memory from ``pool`` (default: a new
    private pool).
    """

    _default_capture_streams = {}

    def __init__(self, flagos_graph: FlagosGraph, pool=None, stream=None,
                 capture_error_mode: str = "global"):
        _require_cuda_driver("torch.flagos.graph")
        if not isinstance(flagos_graph, FlagosGraph):
            raise TypeError(
                f"torch.flagos.graph expects a torch.flagos.FlagosGraph, got {type(flagos_graph).__name__}")
        if stream is None:
            device = current_device()
            stream = self._default_capture_streams.get(device)
            if stream is None:
                stream = self._default_capture_streams[device] = Stream(device)
        else:
            _check_flagos_stream(stream, "the capture stream")
        self.flagos_graph = flagos_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_ctx = _stream(stream)

    def __enter__(self):
        synchronize()
        gc.collect()
        empty_cache()
        self._stream_ctx.__enter__()
        try:
            self.flagos_graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self._stream_ctx.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        try:
            self.flagos_graph.capture_end()
        finally:
            self._stream_ctx.__exit__(*exc)
        return False


def _check_sample_args(sample_args) -> None:
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(sample_args):
        if isinstance(leaf, torch.Tensor) and leaf.device.type != "flagos":
            raise ValueError(
                "torch.flagos.make_graphed_callables: every sample argument must be a flagos "
                f"tensor, got one on {leaf.device}")


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None, **kwargs):
    """Graphed versions of ``callables`` (functions or modules), forward and backward.

    Same contract as ``torch.cuda.make_graphed_callables``, for flagos tensors:
    each callable runs ``num_warmup_iters`` times, then its forward and, when
    anything requires grad, its backward are captured; calling the result
    replays them. On the cuda driver the capture is the CUDA one, on flagos
    streams and the flagos (CUDA caching) allocator.
    """
    _require_cuda_driver("torch.flagos.make_graphed_callables")
    _check_sample_args(sample_args)
    return torch.cuda.make_graphed_callables(
        callables, sample_args, num_warmup_iters=num_warmup_iters,
        allow_unused_input=allow_unused_input, pool=pool, **kwargs)
