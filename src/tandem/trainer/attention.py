"""Attention in full precision inside a half-precision autocast.

Under bf16 or fp16 autocast, torch runs `F.scaled_dot_product_attention` in the half
dtype. On CPUs its half-precision kernels are the slow ones: the bf16 flash-attention
backward is several times slower than fp32's (`benchmarks/attention_precision.py`;
figures in docs/benchmarks.md), while the matrix products around it gain from bf16 where
the CPU has AVX-512 BF16 or AMX. `FullPrecisionAttention` runs each attention call in fp32
(inputs upcast, autocast off for that call, the result cast back to the autocast dtype),
so the model's other operations keep autocast's choice and attention gets fp32's faster
kernels and fp32's accuracy (softmax and its gradient in fp32, as mixed-precision recipes
usually keep them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

_SDPA = F.scaled_dot_product_attention


def resolve(choice: str, device: torch.device) -> str:
    """`precision.attention` for `device`: 'auto' is 'fp32' on CPU, 'autocast' elsewhere
    (CUDA's half-precision attention kernels are its fast ones)."""
    if choice == "auto":
        return "fp32" if device.type == "cpu" else "autocast"
    return choice


class FullPrecisionAttention(TorchFunctionMode):
    """While active, `F.scaled_dot_product_attention` under an enabled autocast of
    `device_type` computes in fp32 and returns the autocast dtype; every other call, and
    attention outside autocast, is untouched."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.calls = 0  # attention calls it ran in fp32

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is not _SDPA or not torch.is_autocast_enabled(self.device_type):
            return func(*args, **kwargs)
        self.calls += 1
        dtype = torch.get_autocast_dtype(self.device_type)
        with torch.autocast(self.device_type, enabled=False):
            out = func(*(_widen(a) for a in args), **{k: _widen(v) for k, v in kwargs.items()})
        return out.to(dtype)


def _widen(value: Any) -> Any:
    """Floating tensors as fp32 (boolean masks and non-tensors as they are)."""
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    return value
