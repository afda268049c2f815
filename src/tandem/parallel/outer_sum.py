"""The sum over ranks of a flat fp32 vector, started in the background, in full or low
precision (a streaming DiLoCo fragment's pseudo-gradient).

- fp32: an all-reduce of the vector itself;
- fp16 / bf16: an all-reduce of a half-precision copy (half the bytes; the sum of N values
  is taken in that precision);
- int8: each rank quantises every tensor's segment with its own scale (absmax / 127) and
  the ranks all-gather the int8 values and the scales; each rank then adds the N
  dequantised vectors in rank order, so every rank holds the same sum. A quarter of
  fp32's bytes per copy, but an all-gather sends N - 1 copies where a ring all-reduce
  sends 2 (N - 1) / N: the saving shrinks as the world grows (at N = 2, 1/4 of fp32's).

Bytes are counted as what one rank sends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

OUTER_DTYPES = ("fp32", "fp16", "bf16", "int8")
_HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


class Sum:
    """A started sum: `wait()` leaves it in the vector it was started on and returns that."""

    def __init__(self, out: torch.Tensor, works: list[Any], bytes_sent: int,
                 finish: Callable[[], None] | None = None) -> None:
        self.out, self.works, self.bytes_sent, self._finish = out, works, bytes_sent, finish

    def is_completed(self) -> bool:
        """Whether every collective behind it has finished (it may still need `wait`)."""
        return all(w.is_completed() for w in self.works)

    def wait(self) -> torch.Tensor:
        """Block until the sum is in `out`; return `out`."""
        for work in self.works:
            work.wait()
        self.works = []
        if self._finish is not None:
            self._finish()
            self._finish = None
        return self.out


def start_sum(flat: torch.Tensor, sizes: list[int], dtype: str,
              group: dist.ProcessGroup | None = None) -> Sum:
    """Start summing the fp32 vector `flat` over the ranks of `group`; the sum replaces
    `flat` once waited for. `sizes`: the lengths of the tensors `flat` is made of (int8
    scales each on its own). All ranks of the group, in the same order."""
    world = dist.get_world_size(group)
    n = flat.numel()
    if dtype == "fp32":
        work = dist.all_reduce(flat, group=group, async_op=True)
        return Sum(flat, [work], _ring(world, n * 4))
    if dtype in _HALF:
        half = flat.to(_HALF[dtype])
        work = dist.all_reduce(half, group=group, async_op=True)
        return Sum(flat, [work], _ring(world, n * half.element_size()),
                   finish=lambda: flat.copy_(half))
    if dtype == "int8":
        return _start_int8(flat, sizes, group, world)
    raise ValueError(f"plan.outer_dtype: {dtype!r} is not one of {list(OUTER_DTYPES)}")


def _ring(world: int, nbytes: int) -> int:
    # A ring all-reduce sends 2 (N-1)/N of the buffer from every rank.
    return int(2 * (world - 1) / world * nbytes)


def quantise(flat: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and one fp32 scale per segment of `sizes` (absmax / 127; 1 when zero)."""
    segments = torch.split(flat, sizes)
    scales = torch.stack([s.abs().max() if s.numel() else flat.new_zeros(())
                          for s in segments]) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    expanded = torch.repeat_interleave(scales, torch.tensor(sizes, device=flat.device))
    q = torch.round(flat / expanded).clamp_(-127, 127).to(torch.int8)
    return q, scales


def dequantise(q: torch.Tensor, scales: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """The fp32 vector `quantise` encoded."""
    return q.float() * torch.repeat_interleave(scales, torch.tensor(sizes, device=q.device))


def _start_int8(flat: torch.Tensor, sizes: list[int], group: dist.ProcessGroup | None,
                world: int) -> Sum:
    q, scales = quantise(flat, sizes)
    qs = [torch.empty_like(q) for _ in range(world)]
    ss = [torch.empty_like(scales) for _ in range(world)]
    works = [dist.all_gather(qs, q, group=group, async_op=True),
             dist.all_gather(ss, scales, group=group, async_op=True)]

    def finish() -> None:
        flat.zero_()
        for q_r, s_r in zip(qs, ss, strict=True):
            flat.add_(dequantise(q_r, s_r, sizes))

    sent = (world - 1) * (q.numel() + scales.numel() * 4)
    return Sum(flat, works, sent, finish)
