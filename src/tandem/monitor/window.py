"""One logging window across ranks: the gather, and the per-rank rows both monitors write.

The live monitor (`tandem.fit`) and the observer (`tandem run --observe`) measure
different things inside a step, but close a window the same way: every rank packs its
figures into one fixed-size float64 vector, one all_gather brings the vectors to every
rank, and rank 0 turns the table into rows. Each rank's straggler score is its own time
(step time minus the time it waited inside backward for the gradient all-reduce) over
the median rank's: synchronised data parallelism makes every rank wait for the slowest
inside backward, so whole step times come out equal and would hide the straggler.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
import torch.distributed as dist

from tandem.monitor.catalogue import MEM_RSS, STRAGGLER_SCORE, TIME_STEP

Row = tuple[int, int, str, float]  # step, rank (-1 = whole job), name, value


def gather(vector: torch.Tensor) -> torch.Tensor:
    """Every rank's `vector` stacked in rank order, on the CPU. All ranks.

    Without a process group (or with one process) the table is this rank's alone.
    """
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return vector.unsqueeze(0).cpu()
    everyone = [torch.empty_like(vector) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, vector)
    return torch.stack(everyone).cpu()


def gather_device() -> torch.device:
    """Where a window vector must live for the group's backend (NCCL: on the GPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def straggler_scores(own_s: Sequence[float]) -> list[float]:
    """Each rank's own time per step over the median rank's (1.0 when the median is 0)."""
    median = statistics.median(own_s)
    return [own / median if median > 0 else 1.0 for own in own_s]


def rank_rows(step: int, ranks: Sequence[int], step_s: Sequence[float],
              wait_s: Sequence[float] | None, rss: Sequence[float],
              scores: bool = True) -> list[Row]:
    """Per-rank step time, resident memory and (with `scores`) straggler score.

    `step_s` and `wait_s` are seconds per step; `wait_s` is the part of each rank's step
    spent waiting for the others (None when unknown: scores then use whole steps).
    """
    own = [s - (w if wait_s is not None else 0.0)
           for s, w in zip(step_s, wait_s or [0.0] * len(step_s), strict=True)]
    rows: list[Row] = []
    for rank, seconds, memory in zip(ranks, step_s, rss, strict=True):
        rows += [(step, rank, TIME_STEP, seconds), (step, rank, MEM_RSS, memory)]
    if scores:
        rows += [(step, rank, STRAGGLER_SCORE, score)
                 for rank, score in zip(ranks, straggler_scores(own), strict=True)]
    return rows
