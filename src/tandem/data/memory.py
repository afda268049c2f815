"""Datasets that fit in memory: read once into stacked tensors, batches gathered by index.

The DataLoader path calls the dataset once per sample and collates every batch anew;
for small samples that per-sample work is a large part of a step. `MemoryDataset`
calls the dataset once per sample at start, collates everything (the DataLoader's own
`default_collate`, in chunks), and then builds each batch by indexing the stacked
tensors with the batch's sample ids. The ids come from the same `GlobalBatchSampler`,
so the samples, their order and their values are those of the DataLoader path.

With a collate of the task's or the dataset's own (samples of different lengths, say),
the samples are read once and kept as they are; each batch is that collate of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from tandem.config import DataConfig

log = logging.getLogger("tandem")

CHUNK = 4096  # samples collated at a time while reading (bounds the per-sample lists)


def _is_values(items: Sequence[Any]) -> bool:
    """Whether a collated list holds plain values (strings) rather than fields."""
    return not any(isinstance(item, torch.Tensor | dict | tuple | list) for item in items)


def join(parts: list[Any]) -> Any:
    """Concatenate collated chunks along the sample dimension."""
    first = parts[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(parts)
    if isinstance(first, dict):
        return {key: join([p[key] for p in parts]) for key in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):  # a namedtuple
        return type(first)(*(join(list(items)) for items in zip(*parts, strict=True)))
    if isinstance(first, list | tuple) and not _is_values(first):  # one entry per field
        joined = [join(list(items)) for items in zip(*parts, strict=True)]
        return tuple(joined) if isinstance(first, tuple) else joined
    values = [value for part in parts for value in part]  # plain values, one per sample
    return tuple(values) if isinstance(first, tuple) else values


def _index(data: Any, ids: torch.Tensor, idlist: list[int]) -> Any:
    """The rows `ids` of every tensor of `data` (entries of plain-value lists)."""
    if isinstance(data, torch.Tensor):
        return data.index_select(0, ids)
    if isinstance(data, dict):
        return {key: _index(value, ids, idlist) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_index(value, ids, idlist) for value in data))
    if isinstance(data, list | tuple) and not _is_values(data):
        return type(data)(_index(value, ids, idlist) for value in data)
    return type(data)(data[i] for i in idlist)


class MemoryDataset(Dataset):
    """Another dataset's samples, collated once into stacked tensors."""

    def __init__(self, dataset: Dataset, name: str = "dataset",
                 collate: Callable[[list[Any]], Any] = default_collate) -> None:
        started = time.perf_counter()
        n = len(dataset)  # type: ignore[arg-type]
        self.collate = collate
        # A collate of the user's may pad, sort or drop: only default_collate's batches
        # are rows of one stacked whole; the others are collated per batch.
        self.samples = None if collate is default_collate else [dataset[i] for i in range(n)]
        parts = [] if self.samples is not None else [
            default_collate([dataset[i] for i in range(s, min(n, s + CHUNK))])
            for s in range(0, n, CHUNK)]
        self.data = join(parts) if parts else None
        self.size = n
        self.load_s = time.perf_counter() - started  # paid before the first step
        log.debug("data.in_memory: %s of %d samples read in %.2f s", name, n, self.load_s)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        if self.samples is not None:
            return self.samples[index]
        return self.gather([index], batched=False)

    def gather(self, indices: Sequence[int], batched: bool = True) -> Any:
        """The batch of samples `indices`, as the collate would have made it."""
        idlist = list(indices)
        if self.samples is not None:
            return self.collate([self.samples[i] for i in idlist])
        batch = _index(self.data, torch.as_tensor(idlist, dtype=torch.int64), idlist)
        return batch if batched else _first(batch)


def _first(batch: Any) -> Any:
    """The one sample of a batch of one."""
    if isinstance(batch, torch.Tensor):
        return batch[0]
    if isinstance(batch, dict):
        return {key: _first(value) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_first(value) for value in batch))
    if isinstance(batch, list | tuple) and not _is_values(batch):
        return type(batch)(_first(value) for value in batch)
    return batch[0]


def load_seconds(*datasets: Dataset | None) -> float:
    """Seconds spent reading these datasets into memory (0 for those read as they go)."""
    return sum(d.load_s for d in datasets if isinstance(d, MemoryDataset))


def held(dataset: Dataset, cfg: DataConfig, name: str,
         collate: Callable[[list[Any]], Any] = default_collate) -> Dataset:
    """`dataset` read into memory when `data.in_memory` says so; otherwise itself."""
    if not cfg.in_memory or isinstance(dataset, MemoryDataset):
        return dataset
    return MemoryDataset(dataset, name, collate)
