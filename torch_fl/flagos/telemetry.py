"""What NVML says about a device, as torch.cuda reports it: utilization,
memory use, temperature, power, clock, and the processes using it.

On the cuda driver flagos device N is CUDA device N, so each call is
torch.cuda's (pynvml, or amdsmi on ROCm, as torch.cuda needs them). The host
driver's devices are host memory and the CPU, which NVML does not describe:
there each call raises, naming the driver.
"""

import torch

from ._device import _index_or_current, _on_cuda


def _cuda_index(name: str, device) -> int:
    index = _index_or_current(device)  # validates the device argument on both drivers
    if not _on_cuda():
        raise RuntimeError(
            f"torch.flagos.{name} needs the cuda driver (it reads NVML); this process runs the flagos "
            "'host' driver, whose devices are host memory and the CPU")
    return index


def utilization(device=None) -> int:
    """Percent of the last sample period the GPU was busy (torch.cuda.utilization)."""
    return torch.cuda.utilization(_cuda_index("utilization", device))


def memory_usage(device=None) -> int:
    """Percent of the last sample period GPU memory was read or written (torch.cuda.memory_usage)."""
    return torch.cuda.memory_usage(_cuda_index("memory_usage", device))


def device_memory_used(device=None) -> int:
    """Bytes of GPU memory in use by every process, as NVML counts them."""
    return torch.cuda.device_memory_used(_cuda_index("device_memory_used", device))


def temperature(device=None) -> int:
    """The GPU's temperature in degrees Celsius (torch.cuda.temperature)."""
    return torch.cuda.temperature(_cuda_index("temperature", device))


def power_draw(device=None) -> int:
    """The GPU's power draw in milliwatts (torch.cuda.power_draw)."""
    return torch.cuda.power_draw(_cuda_index("power_draw", device))


def clock_rate(device=None) -> int:
    """The GPU's SM clock in MHz (torch.cuda.clock_rate)."""
    return torch.cuda.clock_rate(_cuda_index("clock_rate", device))


def list_gpu_processes(device=None) -> str:
    """A readable list of the processes on the GPU and their memory (torch.cuda.list_gpu_processes)."""
    return torch.cuda.list_gpu_processes(_cuda_index("list_gpu_processes", device))


__all__ = ["clock_rate", "device_memory_used", "list_gpu_processes", "memory_usage", "power_draw",
           "temperature", "utilization"]
