"""FLOPs of a step (counted once) and the peak they are compared with (MFU)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

# Dense peak FLOP/s per device from vendor data sheets: (name pattern, the device's
# bf16/fp16 tensor peak, fp32 without TF32, fp32 matmuls in TF32). The patterns are tried
# in order and match whole words: the more specific card first (H100 PCIe before H100,
# L40S before L40 before L4).
_GPU_PEAKS: tuple[tuple[str, float, float, float], ...] = (
    (r"H200 NVL", 836e12, 60e12, 418e12),
    (r"H200", 989e12, 67e12, 494e12),
    (r"H100 (PCIe|NVL)", 756e12, 51e12, 378e12),
    (r"H100", 989e12, 67e12, 494e12),
    (r"A100", 312e12, 19.5e12, 156e12),
    (r"L40S", 362e12, 91.6e12, 183e12),
    (r"L40", 181e12, 90.5e12, 90.5e12),
    (r"L4", 121e12, 30.3e12, 60e12),
)


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
        tf32 = torch.backends.cuda.matmul.allow_tf32
        for pattern, half, fp32, tf32_peak in _GPU_PEAKS:
            if re.search(rf"\b{pattern}\b", name):
                peak = half if precision in ("bf16", "fp16") else (tf32_peak if tf32 else fp32)
                kind = precision if precision != "fp32" else ("tf32" if tf32 else "fp32")
                return peak, f"data sheet ({name}, {kind})"
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
