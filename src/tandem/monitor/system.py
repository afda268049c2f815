"""Host and device figures: memory, CPU, network and disk counters."""

from __future__ import annotations

import time

import psutil
import torch
from torch import nn


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer state held by this rank."""

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t  # DTensor shards
        return local.numel() * local.element_size()

    params = [p for p in model.parameters()]
    opt_bytes = sum(size(v) for state in optimizer.state.values() for v in state.values()
                    if isinstance(v, torch.Tensor))
    return {
        "mem/param_bytes": float(sum(size(p) for p in params)),
        "mem/grad_bytes": float(sum(size(p) for p in params if p.requires_grad)),
        "mem/optim_bytes": float(opt_bytes),
    }


def memory(device: torch.device) -> dict[str, float]:
    """This process's resident memory and, on CUDA, allocator figures."""
    figures = {"mem/rss_bytes": float(psutil.Process().memory_info().rss)}
    if device.type == "cuda":
        figures["mem/cuda_allocated_bytes"] = float(torch.cuda.memory_allocated(device))
        figures["mem/cuda_reserved_bytes"] = float(torch.cuda.memory_reserved(device))
        figures["mem/cuda_peak_bytes"] = float(torch.cuda.max_memory_allocated(device))
        total = torch.cuda.get_device_properties(device).total_memory
        figures["mem/cuda_total_bytes"] = float(total)
    return figures


def gpu_utilisation(device: torch.device) -> dict[str, float]:
    """The device's compute and memory-bandwidth utilisation in percent over the driver's
    last sample period (NVML, from the nvidia-ml-py package); {} where it cannot be read."""
    if device.type != "cuda":
        return {}
    try:
        return {"sys/gpu_util_percent": float(torch.cuda.utilization(device)),
                "sys/gpu_mem_util_percent": float(torch.cuda.memory_usage(device))}
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
            "sys/cpu_percent": psutil.cpu_percent(None),
            "sys/process_cpu_percent": self.process.cpu_percent(None),
        }
        if net is not None and self._net is not None:
            before = self._net.bytes_sent + self._net.bytes_recv
            moved = net.bytes_sent + net.bytes_recv - before
            figures["sys/net_bytes_per_s"] = moved / span
        if disk is not None and self._disk is not None:
            before = self._disk.read_bytes + self._disk.write_bytes
            moved = disk.read_bytes + disk.write_bytes - before
            figures["sys/disk_bytes_per_s"] = moved / span
        self._last, self._net, self._disk = now, net, disk
        if self.gpu:
            figures.update(gpu_utilisation(self.device))
        return figures


def process_times(first_step_at: float | None) -> dict[str, float]:
    """This process's time so far from its start ("end_to_end_s": start-up, data loading,
    training and evaluation) and before its first step ("startup_s"), so that a figure of
    training time alone is never the only one a user compares."""
    born = psutil.Process().create_time()
    out = {"end_to_end_s": time.time() - born}
    if first_step_at is not None:
        out["startup_s"] = first_step_at - born
    return out
