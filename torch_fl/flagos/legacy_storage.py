"""torch.flagos.FloatStorage and the other legacy typed-storage classes, as torch.cuda has them.

PyTorch looks these names up on the device module: ``tensor.storage_type()``
and ``TypedStorage._get_legacy_storage_class`` answer ``torch.flagos.FloatStorage``
for a flagos float tensor, and ``None`` when the module lacks it. A class's
device is read from its module's last name (``torch.storage._get_device_from_module``),
so the classes say they live in ``torch.flagos``: ``torch.flagos.FloatStorage(4)``
is a TypedStorage on flagos, and ``isinstance(t.storage(), torch.flagos.FloatStorage)``
holds for a flagos float tensor's storage, as for CUDA's.
"""

import torch
from torch._utils import classproperty
from torch.storage import _dtype_to_storage_type_map, _LegacyStorage, _warn_typed_storage_removal


class _FlagosLegacyStorage(_LegacyStorage):
    """What CUDA's legacy storages refuse, flagos' refuse too: no host buffer or file is flagos memory."""

    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for flagos storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for flagos storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for flagos storage")


def _storage_class(name: str, dtype: torch.dtype) -> type:
    def warned_dtype(cls):
        _warn_typed_storage_removal()
        return dtype

    return type(name, (_FlagosLegacyStorage,), {
        "__module__": "torch.flagos",
        "__qualname__": name,
        "dtype": classproperty(warned_dtype),
        "_dtype": classproperty(lambda cls: dtype),
    })


CLASSES = {name: _storage_class(name, dtype) for dtype, name in _dtype_to_storage_type_map().items()}
