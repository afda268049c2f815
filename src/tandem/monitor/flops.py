"""FLOPs of a step (counted once) and the peak they are compared with (MFU)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense peak FLOP/s per device from vendor data sheets, by (name fragment, dtype).
_GPU_PEAKS: dict[tuple[str, str], float] = {
    ("H200", "bf16"): 989e12, ("H200", "fp16"): 989e12, ("H200", "fp32"): 67e12,
    ("H100", "bf16"): 989e12, ("H100", "fp16"): 989e12, ("H100", "fp32"): 67e12,
    ("A100", "bf16"): 312e12, ("A100", "fp16"): 312e12, ("A100", "fp32"): 19.5e12,
    ("L4", "bf16"): 121e12, ("L4", "fp16"): 121e12, ("L4", "fp32"): 30e12,
}


def count_flops(run: Callable[[], None]) -> int:
    """FLOPs that torch's counter sees while `run` executes (matmuls, convolutions)."""
    counter = FlopCounterMode(display=False)
    with counter:
        run()
    return int(counter.get_total_flops())


def peak_flops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, how it was obtained): a data-sheet figure or a measured matmul rate."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for (fragment, dtype), peak in _GPU_PEAKS.items():
            if fragment in name and dtype == precision:
                return peak, f"data sheet ({name}, {precision})"
    return measure_matmul(device, precision), f"measured matmul ({device.type}, {precision})"


def measure_matmul(device: torch.device, precision: str, size: int = 512,
                   seconds: float = 0.1) -> float:
    """Best sustained FLOP/s of square matmuls on this device (a short calibration)."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device.type == "cpu" and dtype != torch.float32:
        dtype = torch.float32  # CPU autocast runs most matmuls at fp32 speed or slower
    if device.type == "cuda":
        size = 4096
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or best == 0.0:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best
