"""Host and device figures: memory, CPU, network and disk counters."""

from __future__ import annotations

import time

import psutil
import torch
from torch import nn

from tandem.monitor.catalogue import (
    MEM_CUDA_ALLOCATED,
    MEM_CUDA_PEAK,
    MEM_CUDA_RESERVED,
    MEM_CUDA_TOTAL,
    MEM_GRAD,
    MEM_OPTIM,
    MEM_PARAM,
    MEM_RSS,
    SYS_CPU,
    SYS_DISK,
    SYS_GPU_MEM_UTIL,
    SYS_GPU_UTIL,
    SYS_NET,
    SYS_PROCESS_CPU,
)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state held by this rank."""

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t  # DTensor shards
        return local.numel() * local.element_size()

    params = [p for p in model.parameters()]
    opt_bytes = sum(size(v) for state in optimizer.state.values() for v in state.values()
                    if isinstance(v, torch.Tensor))
    return {
        MEM_PARAM: float(sum(size(p) for p in params)),
        MEM_GRAD: float(sum(size(p) for p in params if p.requires_grad)),
        MEM_OPTIM: float(opt_bytes),
    }


def memory(device: torch.device) -> dict[str, float]:
    """This process's resident memory and, on CUDA, allocator figures."""
    figures = {MEM_RSS: float(psutil.Process().memory_info().rss)}
    if device.type == "cuda":
        figures[MEM_CUDA_ALLOCATED] = float(torch.cuda.memory_allocated(device))
        figures[MEM_CUDA_RESERVED] = float(torch.cuda.memory_reserved(device))
        figures[MEM_CUDA_PEAK] = float(torch.cuda.max_memory_allocated(device))
        total = torch.cuda.get_device_properties(device).total_memory
        figures[MEM_CUDA_TOTAL] = float(total)
    return figures


def gpu_utilisation(device: torch.device) -> dict[str, float]:
    """The device's compute and memory-bandwidth utilisation in percent over the driver's
    last sample period (NVML, from the nvidia-ml-py package); {} where it cannot be read."""
    if device.type != "cuda":
        return {}
    try:
        return {SYS_GPU_UTIL: float(torch.cuda.utilization(device)),
                SYS_GPU_MEM_UTIL: float(torch.cuda.memory_usage(device))}
    except Exception:  # noqa: BLE001 - no NVML (pip install nvidia-ml-py) or no permission
        return {}


class SystemSampler:
    """CPU (and GPU) utilisation and network/disk byte rates between two calls."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")
        # Read once: without NVML every later window skips the attempt.
        self.gpu = bool(gpu_utilisation(self.device))
        self.process = psutil.Process()
        self.process.cpu_percent(None)
        psutil.cpu_percent(None)
        self._last = time.perf_counter()
        self._net = psutil.net_io_counters()
        self._disk = psutil.disk_io_counters()

    def sample(self) -> dict[str, float]:
        """Figures since the previous sample."""
        now = time.perf_counter()
        span = max(now - self._last, 1e-9)
        net, disk = psutil.net_io_counters(), psutil.disk_io_counters()
        figures = {
            SYS_CPU: psutil.cpu_percent(None),
            SYS_PROCESS_CPU: self.process.cpu_percent(None),
        }
        if net is not None and self._net is not None:
            before = self._net.bytes_sent + self._net.bytes_recv
            moved = net.bytes_sent + net.bytes_recv - before
            figures[SYS_NET] = moved / span
        if disk is not None and self._disk is not None:
            before = self._disk.read_bytes + self._disk.write_bytes
            moved = disk.read_bytes + disk.write_bytes - before
            figures[SYS_DISK] = moved / span
        self._last, self._net, self._disk = now, net, disk
        if self.gpu:
            figures.update(gpu_utilisation(self.device))
        return figures


def process_times(first_step_at: float | None) -> dict[str, float]:
    """This process's time so far from its start ("end_to_end_s": start-up, data loading,
    training and evaluation) and before its first step ("startup_s"), so that a figure of
    training time alone is never the only one a user compares."""
    from tandem.monitor.startup import process_started_at

    born = process_started_at()
    out = {"end_to_end_s": time.time() - born}
    if first_step_at is not None:
        out["startup_s"] = first_step_at - born
    return out
