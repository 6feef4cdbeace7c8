"""Random number generation on flagos devices (shaped like torch.cuda.random)."""

import copyreg

import torch

from .. import _C
from ._device import _device_index, current_device, device_count


class _DefaultGenerators(tuple):
    pass


def _make_default_generators():
    return _DefaultGenerators(_C._get_default_generator(i) for i in range(device_count()))


default_generators = _make_default_generators()


def _generator(device) -> torch.Generator:
    index = _device_index(device)
    return default_generators[current_device() if index < 0 else index]


def get_rng_state(device="flagos") -> torch.Tensor:
    """The RNG state of ``device`` as a CPU uint8 tensor."""
    return _generator(device).get_state()


def get_rng_state_all() -> list:
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device="flagos") -> None:
    """Restores a state returned by :func:`get_rng_state`."""
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(
            f"set_rng_state expects a torch.ByteTensor from get_rng_state(), "
            f"got {type(new_state).__name__}"
        )
    with torch.no_grad():
        state = new_state.detach().clone(memory_format=torch.contiguous_format)
    _generator(device).set_state(state)


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seeds the current device's generator."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for g in default_generators:
        g.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a random number."""
    _generator(None).seed()


def seed_all() -> None:
    s = _generator(None).seed()
    for g in default_generators:
        g.manual_seed(s)


def initial_seed() -> int:
    return _generator(None).initial_seed()


def _reduce_generator(g: torch.Generator):
    """Pickles (and deep-copies) a host-driver flagos generator as the CPU's is pickled.

    ``torch.Generator.__reduce__`` saves an offset for every generator not on
    the CPU, since CUDA's Philox generator has one. The host driver's flagos
    generator draws from the CPU's generator, whose state is all there is:
    asking it for an offset raises. Its reduction is therefore the CPU's, an
    offset of None, which ``__setstate__`` skips. Every other generator keeps
    PyTorch's reduction.
    """
    if g.device.type == "flagos" and _C._driver_name() == "host":
        return (torch.Generator, (g.device,), (g.initial_seed(), None, g.get_state()))
    return g.__reduce__()


def install_generator_pickling() -> None:
    """Registers :func:`_reduce_generator` with copyreg, which pickle and deepcopy consult first."""
    copyreg.pickle(torch.Generator, _reduce_generator)
