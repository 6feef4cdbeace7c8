"""Automatic mixed precision on flagos: what torch.autocast("flagos") may cast to,
and torch.cuda.amp's deprecated class names for scripts ported from CUDA."""

import torch

from .memory import _deprecated as deprecated


def get_amp_supported_dtype():
    """The dtypes torch.autocast("flagos", dtype=...) accepts.

    torch.autocast("cuda") checks no dtype, and programs pass float32 to keep
    autocast's structure at full precision; any other dtype is refused by
    PyTorch with a warning naming these.
    """
    return [torch.float16, torch.bfloat16, torch.float32]


class autocast(torch.amp.autocast):
    """``torch.amp.autocast("flagos", ...)`` under torch.cuda.amp's old name (deprecated)."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        deprecated("amp.autocast(args...) is deprecated. Please use "
                   "torch.amp.autocast('flagos', args...) instead.")
        super().__init__("flagos", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler("flagos", ...)`` under torch.cuda.amp's old name (deprecated)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        deprecated("amp.GradScaler(args...) is deprecated. Please use "
                   "torch.amp.GradScaler('flagos', args...) instead.")
        super().__init__("flagos", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
