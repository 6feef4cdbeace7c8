"""Copies between flagos devices of one process, for ``torch.nn.parallel``.

``nn.DataParallel`` and ``torch.nn.parallel.comm`` move tensors between the
devices of the machine's accelerator through ``torch._C._broadcast``,
``_broadcast_coalesced``, ``_scatter``, ``_gather`` and their ``_out`` forms.
Only CUDA and XPU builds of torch define them, each for its own device. On a
torch without them, the accelerator DataParallel picks once torch_fl is loaded
is flagos (``torch._utils._get_available_device_type``), so torch_fl supplies
them there for flagos devices: device indexes are flagos device indexes.
They follow CUDA's implementations (torch/csrc/cuda/comm.cpp): the same
arguments, results, checks and non-blocking copies on the given streams. Where
torch has its own, nothing is installed and the program gets torch's.
"""

import torch
from torch._utils import (
    _flatten_dense_tensors,
    _flatten_sparse_tensors,
    _reorder_tensors_as,
    _take_tensors,
    _unflatten_dense_tensors,
    _unflatten_sparse_tensors,
)

_TYPE = "flagos"


def _index(tensor: torch.Tensor) -> int:
    """The tensor's flagos device index; -1 for a tensor on another device (as CUDA's get_device)."""
    return tensor.device.index if tensor.device.type == _TYPE else -1


def _check_device_index(device) -> int:
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"expected a flagos device index (an int), but got {device!r}")
    if device < 0:
        raise RuntimeError(f"Expected non-negative device index, but got {device}")
    return device


def _wrap_dim(dim: int, ndim: int) -> int:
    low, high = -max(ndim, 1), max(ndim, 1) - 1
    if not low <= dim <= high:
        raise IndexError(f"Dimension out of range (expected to be in range of [{low}, {high}], but got {dim})")
    return dim % max(ndim, 1)


def _check_flagos(tensor: torch.Tensor, what: str, i: int) -> None:
    if tensor.device.type != _TYPE:
        raise RuntimeError(
            f"Expected all {what} tensors to be flagos tensors, but {what} tensor at index {i} "
            f"has device '{tensor.device}'"
        )


class _OnStream:
    """Makes ``streams[i]`` current for a copy to ``device``, where one is given."""

    def __init__(self, streams, i: int, device: int):
        self._stream = streams[i] if streams is not None and i < len(streams) else None
        if self._stream is not None:
            if self._stream.device.type != _TYPE or self._stream.device_index != device:
                raise RuntimeError(
                    f"Expected the device associated with the stream at index {i} (was "
                    f"{self._stream.device}) to match the device supplied at that index "
                    f"(expected {_TYPE}:{device})"
                )
        self._previous = None
        self._device = None

    def __enter__(self):
        if self._stream is not None:
            # set_stream also makes the stream's device current: both are restored on exit.
            self._device = torch.accelerator.current_device_index()
            self._previous = torch.accelerator.current_stream(self._stream.device_index)
            torch.accelerator.set_stream(self._stream)

    def __exit__(self, *exc):
        if self._previous is not None:
            torch.accelerator.set_stream(self._previous)
            torch.accelerator.set_device_index(self._device)


def _broadcast_out(tensor: torch.Tensor, out):
    for i, o in enumerate(out):
        _check_flagos(o, "output", i)
        if o.shape != tensor.shape:
            raise RuntimeError(
                "Expected all output tensors to have same shape as the source tensor "
                f"{list(tensor.shape)}, but output tensor at index {i} has shape {list(o.shape)}"
            )
    for o in out:
        o.copy_(tensor, non_blocking=True)
    return list(out)


def _broadcast(tensor: torch.Tensor, devices):
    source = _index(tensor)
    results = []
    for d in (_check_device_index(d) for d in devices):
        if d == source:
            results.append(tensor)
        else:
            out = torch.empty(tensor.shape, dtype=tensor.dtype, device=torch.device(_TYPE, d))
            results.append(out.copy_(tensor, non_blocking=True))
    return results


def _broadcast_coalesced(tensors, devices, buffer_size: int):
    devices = [_check_device_index(d) for d in devices]
    if not devices:
        raise RuntimeError("Expected at least one device to broadcast to")
    for i, t in enumerate(tensors):
        if _index(t) != devices[0]:
            raise RuntimeError(
                f"All tensors must be on devices[0]: {devices[0]}; tensor at index {i} is on {t.device}"
            )
    outputs = [list(tensors)] + [[] for _ in devices[1:]]
    for chunk in _take_tensors(list(tensors), buffer_size):
        if chunk[0].is_sparse:
            indices, values = _flatten_sparse_tensors(chunk)
            all_indices = _broadcast(indices, devices)
            all_values = _broadcast(values, devices)
            for i in range(1, len(devices)):
                for t in _unflatten_sparse_tensors((all_indices[i], all_values[i]), chunk):
                    # .data: each result its own tensor with its own version counter, not a
                    # view of the discarded buffer (NOTE [ Version Counter in comm.*_coalesced ]).
                    outputs[i].append(t.data)
        else:
            flats = _broadcast(_flatten_dense_tensors(chunk), devices)
            for i in range(1, len(devices)):
                outputs[i].extend(t.data for t in _unflatten_dense_tensors(flats[i], chunk))
    # _take_tensors groups by type; put each device's list back in the inputs' order.
    for i in range(1, len(devices)):
        outputs[i] = list(_reorder_tensors_as(outputs[i], tensors))
    return outputs


def _scatter(tensor: torch.Tensor, devices, chunk_sizes, dim: int, streams):
    devices = list(devices)
    if not devices:
        raise RuntimeError("Expected at least one device to scatter to")
    if chunk_sizes is not None:
        chunk_sizes = list(chunk_sizes)
        if len(chunk_sizes) != len(devices):
            raise RuntimeError(
                "Expected devices and chunk_sizes to be of same length, but got "
                f"len(devices) = {len(devices)} and len(chunk_sizes) = {len(chunk_sizes)}"
            )
        chunks = list(tensor.split(chunk_sizes, dim))
    else:
        chunks = list(tensor.chunk(len(devices), dim))
    source = _index(tensor)
    for i, chunk in enumerate(chunks):
        d = _check_device_index(devices[i])
        if d != source:
            with _OnStream(streams, i, d):
                chunks[i] = chunk.to(torch.device(_TYPE, d), non_blocking=True)
    return chunks


def _scatter_out(tensor: torch.Tensor, out, dim: int, streams):
    out = list(out)
    if not out:
        raise RuntimeError("Expected at least one output tensor to scatter to")
    dim = _wrap_dim(dim, tensor.dim())
    sizes = []
    for i, o in enumerate(out):
        _check_flagos(o, "output", i)
        expected = list(tensor.shape)
        if o.dim() == tensor.dim():
            expected[dim] = o.shape[dim]
        if list(o.shape) != expected:
            raise RuntimeError(
                f"Output tensor at index {i} has incorrect shape: {list(o.shape)}. Expected same shape "
                f"except for scatter dim {dim} as the source tensor: {list(tensor.shape)}"
            )
        sizes.append(o.shape[dim])
    if sum(sizes) != tensor.shape[dim]:
        raise RuntimeError(
            f"Total size for output tensors along scatter dim {dim} does not match the source tensor "
            f"size at dim {dim}. Expected {tensor.shape[dim]}, but got total size {sum(sizes)}"
        )
    for i, (o, chunk) in enumerate(zip(out, tensor.split(sizes, dim))):
        with _OnStream(streams, i, _index(o)):
            o.copy_(chunk, non_blocking=True)
    return out


def _gather_shape(tensors, dim: int):
    """The gathered shape and dim (wrapped), after CUDA's checks of the inputs."""
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("Expected at least one tensor to gather from")
    first = tensors[0]
    dim = _wrap_dim(dim, first.dim())
    expected = list(first.shape)
    total = 0
    for i, t in enumerate(tensors):
        _check_flagos(t, "input", i)
        if t.dim() != len(expected):
            raise RuntimeError(
                "Expected all input tensors to have the same number of dimensions, but tensor at "
                f"index {i} has {t.dim()} dimensions, (expected {len(expected)})"
            )
        expected[dim] = t.shape[dim]
        if list(t.shape) != expected:
            raise RuntimeError(f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
        total += t.shape[dim]
    expected[dim] = total
    return tensors, expected, dim


def _gather_into(tensors, out: torch.Tensor, dim: int) -> torch.Tensor:
    for part, t in zip(out.split([t.shape[dim] for t in tensors], dim), tensors):
        part.copy_(t, non_blocking=out.device.type == _TYPE)
    return out


def _gather(tensors, dim: int, destination):
    tensors, shape, dim = _gather_shape(tensors, dim)
    from torch._prims_common import suggest_memory_format

    # CUDA's: the first input's suggested format, where every input suggests it.
    memory_format = suggest_memory_format(tensors[0])
    if any(suggest_memory_format(t) != memory_format for t in tensors):
        memory_format = torch.contiguous_format
    if destination == -1:
        device = torch.device("cpu")
    elif destination is None:
        device = torch.device(_TYPE, torch.accelerator.current_device_index())
    else:
        device = torch.device(_TYPE, _check_device_index(destination))
    out = torch.empty(shape, dtype=tensors[0].dtype, device=device, memory_format=memory_format)
    return _gather_into(tensors, out, dim)


def _gather_out(tensors, out: torch.Tensor, dim: int):
    tensors, shape, dim = _gather_shape(tensors, dim)
    if list(out.shape) != shape:
        raise RuntimeError(f"Expected out tensor to have shape {shape}, but got {list(out.shape)}")
    return _gather_into(tensors, out, dim)


_FUNCTIONS = {
    "_broadcast": _broadcast,
    "_broadcast_out": _broadcast_out,
    "_broadcast_coalesced": _broadcast_coalesced,
    "_scatter": _scatter,
    "_scatter_out": _scatter_out,
    "_gather": _gather,
    "_gather_out": _gather_out,
}


def install() -> None:
    """Supplies the functions torch.nn.parallel.comm calls, on a torch that has none of them."""
    if any(hasattr(torch._C, name) and getattr(torch._C, name) is not fn for name, fn in _FUNCTIONS.items()):
        return  # torch's own (CUDA or XPU build): they serve its device, and DataParallel picks it
    for name, fn in _FUNCTIONS.items():
        setattr(torch._C, name, fn)
