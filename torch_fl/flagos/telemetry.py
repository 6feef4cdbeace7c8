"""What NVML says about a device, as torch.cuda reports it: utilization,
memory use, temperature, power, clock, and the processes using it.

On the cuda driver flagos device N is CUDA device N, so each call is
torch.cuda's (pynvml, or amdsmi on ROCm, as torch.cuda needs them). The host
driver's devices are host memory and the CPU, which NVML does not describe:
there each call raises, naming the driver.
"""

import torch

from ._device import _index_or_current, _on_cuda


def _query(name: str, doc: str):
    """torch.flagos.<name>(device=None): torch.cuda.<name> for the same GPU."""

    def query(device=None):
        index = _index_or_current(device)  # validates the device argument on both drivers
        if not _on_cuda():
            raise RuntimeError(
                f"torch.flagos.{name} needs the cuda driver (it reads NVML); this process runs the flagos "
                "'host' driver, whose devices are host memory and the CPU")
        return getattr(torch.cuda, name)(index)

    query.__name__ = query.__qualname__ = name
    query.__doc__ = doc
    return query


utilization = _query("utilization", "Percent of the last sample period the GPU was busy.")
memory_usage = _query("memory_usage", "Percent of the last sample period GPU memory was read or written.")
device_memory_used = _query("device_memory_used", "Bytes of GPU memory in use by every process, as NVML counts them.")
temperature = _query("temperature", "The GPU's temperature in degrees Celsius.")
power_draw = _query("power_draw", "The GPU's power draw in milliwatts.")
clock_rate = _query("clock_rate", "The GPU's SM clock in MHz.")
list_gpu_processes = _query("list_gpu_processes", "A readable list of the processes on the GPU and their memory.")

__all__ = ["clock_rate", "device_memory_used", "list_gpu_processes", "memory_usage", "power_draw",
           "temperature", "utilization"]
