"""Batches from a Dataset to the device: DataLoader workers, pinned memory, prefetch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from tandem.config import DataConfig
from tandem.data.memory import MemoryDataset
from tandem.data.sampler import GlobalBatchSampler
from tandem.runtime import derive_seed

Collate = Callable[[list[Any]], Any]


def collate_of(dataset: Dataset, collate: Collate | None = None) -> Collate:
    """What makes one micro-batch of samples: `collate` (Task.collate), else the dataset's
    own `collate_fn` attribute (as many datasets carry one), else torch's default_collate."""
    if collate is not None:
        return collate
    own = getattr(dataset, "collate_fn", None)
    return own if callable(own) else default_collate


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor in a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, non_blocking) for v in batch]
        return type(batch)(moved) if not hasattr(batch, "_fields") else type(batch)(*moved)
    return batch


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        return batch_size(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return batch_size(batch[0])
    raise ValueError(f"cannot tell the batch size of a {type(batch).__name__}; use tensors")


def _loader(dataset: Dataset, sampler: Iterable[list[int]], cfg: DataConfig,
            device: torch.device, seed: int, collate: Collate | None) -> DataLoader:
    workers = cfg.workers
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate_of(dataset, collate),
        num_workers=workers,
        pin_memory=cfg.pin_memory and device.type == "cuda",
        prefetch_factor=cfg.prefetch if workers > 0 else None,
        generator=torch.Generator().manual_seed(seed),
    )


def train_batches(dataset: Dataset, sampler: GlobalBatchSampler, cfg: DataConfig,
                  device: torch.device, collate: Collate | None = None) -> Iterator[Any]:
    """This rank's micro-batches on `device`, in the global order, without end. Each
    micro-batch's samples are collated together (`collate_of`)."""
    if isinstance(dataset, MemoryDataset):  # data.in_memory: gathered, not loaded
        batches: Iterator[Any] = (dataset.gather(ids) for ids in sampler)
    else:
        seed = derive_seed("loader", sampler.seed, sampler.rank, sampler.cursor.epoch,
                           sampler.cursor.offset)
        batches = iter(_loader(dataset, sampler, cfg, device, seed, collate))
    if device.type == "cuda":
        return _cuda_prefetch(batches, device)
    return batches


def _cuda_prefetch(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """Copy batch i+1 on a side stream while the default stream computes batch i."""
    stream = torch.cuda.Stream(device)

    def copy(batch: Any) -> Any:
        with torch.cuda.stream(stream):
            return to_device(batch, device, non_blocking=True)

    pending = copy(next(batches))
    for upcoming in batches:
        torch.cuda.current_stream(device).wait_stream(stream)
        ready = pending
        _record(ready, torch.cuda.current_stream(device))
        pending = copy(upcoming)
        yield ready


def _record(batch: Any, stream: torch.cuda.Stream) -> None:
    # Tell the caching allocator the compute stream uses memory made on the side stream.
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, dict):
        for value in batch.values():
            _record(value, stream)
    elif isinstance(batch, (list, tuple)):
        for value in batch:
            _record(value, stream)


def eval_batches(dataset: Dataset, indices: range, batch: int, cfg: DataConfig,
                 device: torch.device, collate: Collate | None = None) -> Iterator[Any]:
    """This rank's evaluation batches on `device` (an uneven last batch is kept)."""
    chunks = [list(indices[i : i + batch]) for i in range(0, len(indices), batch)]
    items = ((dataset.gather(ids) for ids in chunks) if isinstance(dataset, MemoryDataset)
             else _loader(dataset, chunks, cfg, device, 0, collate))
    for item in items:
        yield to_device(item, device, non_blocking=True)
