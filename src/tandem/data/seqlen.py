"""Sequence-length warm-up: train on the first LEN positions of each sequence early on.

Short sequences early in training are cheaper steps that teach the model as much per
step while it still learns local statistics (Li et al. 2022, "The stability-efficiency
dilemma"). `train.seq_ramp` lists from which step which length applies; the batch's
tensors with two or more dimensions are cut along dimension 1 (the sequence), so inputs
and next-token targets stay aligned. Evaluation always sees the full length.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from tandem.config.values import parse_seq_ramp


def cut(batch: Any, length: int) -> Any:
    """`batch` with every tensor of 2+ dimensions cut to `length` along dimension 1."""
    if isinstance(batch, torch.Tensor):
        return batch[:, :length].contiguous() if batch.dim() >= 2 else batch
    if isinstance(batch, dict):
        return {key: cut(value, length) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(cut(value, length) for value in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(cut(value, length) for value in batch)
    return batch


class SeqRamp:
    """The sequence length of each step, from `train.seq_ramp`."""

    def __init__(self, text: str) -> None:
        self.pairs = parse_seq_ramp(text)

    def length_at(self, step: int) -> int:
        """The length of step `step`'s batches (0: the full length)."""
        length = 0
        for start, value in self.pairs:
            if step >= start:
                length = value
        return length

    def apply(self, batches: Iterator[Any], step: Callable[[], int]) -> Iterator[Any]:
        """`batches`, each cut to the length of the step it is drawn for."""
        for batch in batches:
            length = self.length_at(step())
            yield cut(batch, length) if length else batch
