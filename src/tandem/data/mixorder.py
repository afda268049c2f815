"""The order of a mixture of sources: which source, and which of its samples, fills each
position of the global sample stream. A pure function of (seed, epoch, position).

An epoch of the mixture has as many positions as its sources hold samples together (N).
Source k fills exactly `c_k` of them (its probability times N, apportioned by largest
remainder), spread evenly over the epoch (its j-th position near (j + u_k) / c_k of it,
u_k a random phase) and shuffled within blocks of `BLOCK` positions: any window of the
stream holds each source's share to within a few samples. Each source walks its own
permutations, epoch after epoch of its own, so within a source no sample repeats before
every other one has been drawn: its j-th position of mixture epoch e takes draw number
e * c_k + j of that walk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tandem.runtime import derive_seed

BLOCK = 16  # positions shuffled together: small enough that any window keeps the shares


def probabilities(sizes: Sequence[int], weights: Sequence[float | None],
                  temperature: float | None, names: Sequence[str]) -> list[float]:
    """Each source's share of the stream: its weight, normalised; with `temperature` T,
    proportional to size^(1/T) (T5's temperature mixing: T = 1 is proportional to size,
    larger T flattens towards uniform); with neither, proportional to size."""
    given = [w is not None for w in weights]
    if temperature is not None and any(given):
        raise ValueError("tandem.Mixture: give either a temperature or each source a weight, "
                         f"not both (temperature={temperature!r}, weights of "
                         f"{[n for n, g in zip(names, given, strict=True) if g]})")
    if any(given) and not all(given):
        missing = [n for n, g in zip(names, given, strict=True) if not g]
        raise ValueError(f"tandem.Mixture: sources {missing} have no weight while others "
                         "do; give every source a weight, or none (then a temperature or "
                         "the sources' sizes decide)")
    if any(given):
        raw = [float(w) for w in weights]  # type: ignore[arg-type]
    else:
        t = 1.0 if temperature is None else float(temperature)
        raw = [n ** (1.0 / t) for n in sizes]
    total = math.fsum(raw)
    return [r / total for r in raw]


def apportion(total: int, probs: Sequence[float]) -> list[int]:
    """Whole counts summing to `total`, closest to `total * p` (largest remainder)."""
    exact = [total * p for p in probs]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(probs)), key=lambda k: (counts[k] - exact[k], k))
    for k in by_remainder[:total - sum(counts)]:
        counts[k] += 1
    return counts


def _generator(*parts: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def _sources_of(seed: int, epoch: int, counts: Sequence[int]) -> torch.Tensor:
    """The source of each position of the epoch."""
    phase = torch.rand(len(counts), generator=_generator("mix-phase", seed, epoch),
                       dtype=torch.float64)
    keys = [(torch.arange(c, dtype=torch.float64) + phase[k]) / c
            for k, c in enumerate(counts)]
    source = torch.cat([torch.full((c,), k, dtype=torch.int64) for k, c in enumerate(counts)])
    source = source[torch.argsort(torch.cat(keys), stable=True)]
    n = source.numel()
    jitter = torch.rand(n, generator=_generator("mix-block", seed, epoch), dtype=torch.float64)
    return source[torch.argsort(torch.arange(n, dtype=torch.float64).div(BLOCK).floor()
                                + jitter)]


def source_sample(seed: int, k: int, start: int, count: int, size: int) -> torch.Tensor:
    """Source k's draws number start .. start + count - 1: its own epochs of `size` samples
    follow each other, each a permutation drawn from (seed, k, its number)."""
    first, last = start // size, (start + count - 1) // size
    walk = torch.cat([torch.randperm(size, generator=_generator("mix-source", seed, k, e))
                      for e in range(first, last + 1)])
    return walk[start - first * size:][:count]


def mixture_epoch(seed: int, epoch: int, sizes: Sequence[int],
                  counts: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, sample index within that source) of every position of mixture epoch
    `epoch`: `counts[k]` positions of source k of `sizes[k]` samples."""
    source = _sources_of(seed, epoch, counts)
    sample = torch.empty_like(source)
    for k, (size, c) in enumerate(zip(sizes, counts, strict=True)):
        # Its c draws of this epoch, in stream order: numbers epoch * c .. of its walk.
        sample[source == k] = source_sample(seed, k, epoch * c, c, size)
    return source, sample
