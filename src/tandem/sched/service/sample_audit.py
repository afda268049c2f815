"""Proof from the data itself that a job trained on every sample once, through every resize.

A job opts in by logging the ids of each training micro-batch (`SampleLog`, one file per
process in the directory named by TANDEM_SAMPLE_LOG); `audit` then checks those logs
against the documented global order (`tandem.data.sampler.epoch_order(seed, epoch, n)`):

- every logged micro-batch is a contiguous slice of one epoch's permutation (a rank takes
  its slice of each global batch, at any world size);
- within each epoch the slices cover a prefix of the permutation, each position once: a
  position covered twice is a repeated sample, a hole before the last covered position
  a skipped one; an epoch left before its end leaves a tail shorter than a global batch.

The audit needs no step numbers, so it holds across changes of world size and of the
global batch; it is independent of the trainer's own bookkeeping (checkpoint counters).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SAMPLE_LOG_ENV = "TANDEM_SAMPLE_LOG"


class SampleLog:
    """Appends the sample ids of each training micro-batch to this process's file."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        where = directory or os.environ.get(SAMPLE_LOG_ENV)
        self.path: Path | None = None
        if where:
            # A scheduled job's processes write into a folder of the job's own.
            folder = Path(where) / os.environ.get("TANDEM_SCHED_JOB", "")
            folder.mkdir(parents=True, exist_ok=True)
            self.path = folder / f"ids-{os.uname().nodename}-{os.getpid()}.txt"

    def record(self, ids: Any) -> None:
        """Log `ids` (a tensor or a sequence) if this is a training pass (gradients on)."""
        if self.path is None or not torch.is_grad_enabled():
            return
        values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        rank, world = os.environ.get("RANK", "0"), os.environ.get("WORLD_SIZE", "1")
        with self.path.open("a", encoding="utf-8") as f:
            f.write(f"{rank} {world} " + " ".join(str(int(v)) for v in values) + "\n")


class WithIds(torch.utils.data.Dataset):
    """A dataset whose items carry their index last: (*item, index)."""

    def __init__(self, base: torch.utils.data.Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        item = self.base[i]
        return (*(item if isinstance(item, tuple) else (item,)), i)


def read_logs(directory: Path) -> list[list[int]]:
    """Every logged micro-batch (its ids) from every process's file in `directory`."""
    batches = []
    for path in sorted(directory.glob("ids-*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if len(fields) > 2:
                batches.append([int(v) for v in fields[2:]])
    return batches


@dataclass(frozen=True)
class Audit:
    """What the logs show, per epoch and in total."""

    samples: int
    """Sample positions trained on (each counted once)."""
    repeated: int
    """Positions trained on more than once (extra times, summed)."""
    skipped: int
    """Positions inside the covered prefix of an epoch never trained on."""
    not_slices: int
    """Logged micro-batches that are no contiguous slice of any epoch's order."""
    epochs: int
    tails: tuple[int, ...]
    """Samples left at the end of each finished epoch (the dropped tail)."""

    @property
    def clean(self) -> bool:
        """Nothing repeated, skipped or out of order."""
        return self.repeated == 0 and self.skipped == 0 and self.not_slices == 0


def audit(batches: Iterable[Sequence[int]], seed: int, dataset_len: int) -> Audit:
    """Check logged micro-batches against the global order of (seed, dataset_len)."""
    from tandem.data.sampler import epoch_order

    batches = [list(b) for b in batches if b]
    indices = [torch.tensor(ids) for ids in batches]
    # Each micro-batch's candidates: (epoch, positions) where it is a contiguous slice.
    # A short slice may be contiguous by chance in another epoch too: slices with one
    # candidate are placed first, then the others where their positions are still free.
    found: list[list[tuple[int, torch.Tensor]]] = [[] for _ in batches]
    # Epochs to look in: the samples' worth of epochs and two more, then more while the
    # last ones placed a micro-batch that had no place (each epoch drops a tail shorter
    # than the global batch, so a long run reaches further than samples / dataset_len; a
    # batch that is no slice at all stops the search once further epochs place nothing).
    look, epochs = sum(len(b) for b in batches) // max(1, dataset_len) + 2, 0
    unplaced = len(batches)
    while True:
        for epoch in range(epochs, look):
            order = epoch_order(seed, epoch, dataset_len)
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(dataset_len)
            for options, index in zip(found, indices, strict=True):
                where = inverse[index]
                if bool((where == where[0] + torch.arange(len(index))).all()):
                    options.append((epoch, where))
        epochs, before = look, unplaced
        unplaced = sum(1 for options in found if not options)
        if not unplaced or unplaced == before:
            break
        look = epochs + max(2, epochs // 4)
    counts = [torch.zeros(dataset_len, dtype=torch.int64) for _ in range(epochs)]
    not_slices = sum(1 for options in found if not options)
    for options in sorted((o for o in found if o), key=len):
        free = [(e, w) for e, w in options if not bool(counts[e][w].any())]
        epoch, where = (free or options)[0]
        counts[epoch][where] += 1
    last = max((i for i, c in enumerate(counts) if int(c.sum())), default=-1)
    used = counts[:last + 1]
    repeated = sum(int((c - 1).clamp(min=0).sum()) for c in used)
    skipped, tails = 0, []
    for i, c in enumerate(used):
        covered = torch.nonzero(c).flatten()
        end = int(covered.max()) + 1 if len(covered) else dataset_len
        skipped += end - len(covered)  # an epoch never reached is skipped whole
        if i < len(used) - 1:
            tails.append(dataset_len - end)
    return Audit(samples=sum(int((c > 0).sum()) for c in used), repeated=repeated,
                 skipped=skipped, not_slices=not_slices, epochs=len(used), tails=tuple(tails))
