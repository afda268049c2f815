"""Thin wrappers so the checkpoint code reads the same with and without a process group."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch.distributed as dist

from tandem.checkpoint.errors import CheckpointError

T = TypeVar("T")


def initialized() -> bool:
    """Return True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """Return this process's global rank, 0 without a process group."""
    return dist.get_rank() if initialized() else 0


def world_size() -> int:
    """Return the number of processes, 1 without a process group."""
    return dist.get_world_size() if initialized() else 1


def gather_problems(mine: str | None) -> list[str]:
    """Every rank's problem (None: none), as one list on every rank. All ranks."""
    if not initialized():
        return [mine] if mine else []
    everyone: list[str | None] = [None] * world_size()
    dist.all_gather_object(everyone, mine)
    settle()
    return [p for p in everyone if p]


def union(keys: set[str]) -> set[str]:
    """The union of every rank's `keys` (a no-op without a process group). All ranks."""
    if not initialized():
        return keys
    everyone: list[set[str] | None] = [None] * world_size()
    dist.all_gather_object(everyone, keys)
    settle()
    return set().union(*(k for k in everyone if k))


def broadcast_from_zero(value: Any) -> Any:
    """Return rank 0's ``value`` on every rank (a no-op without a process group).

    Must be called on all ranks. It doubles as a barrier: no rank returns before rank 0
    has reached this call, which is what the commit protocol relies on.
    """
    if not initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    settle()
    return box[0]


def settle() -> None:
    """Barrier after collectives on Python-made tensors, so teardown cannot deadlock.

    Gloo's worker thread releases a finished collective's tensors only once it gets the
    GIL. If the group is destroyed before that while the GIL is held (e.g. DDP's reducer
    drops the last reference to the group after ``destroy_process_group``), the
    destructor joins that thread and the process hangs (seen with torch 2.13). A
    barrier waits with the GIL released, which lets the worker finish first.
    """
    if initialized():
        dist.barrier()


def on_rank_zero(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and return its result on every rank.

    Must be called on all ranks. If ``fn`` raises, rank 0 re-raises the original error
    and the other ranks raise a ValueError or CheckpointError with the same message:
    without this the other ranks would wait forever for a broadcast that never comes.
    """
    if not initialized():
        return fn()
    if rank() == 0:
        try:
            value = fn()
        except Exception as err:
            broadcast_from_zero(("error", isinstance(err, ValueError), str(err)))
            raise
        broadcast_from_zero(("ok", value))
        return value
    outcome = broadcast_from_zero(None)
    if outcome[0] == "ok":
        return outcome[1]
    _, is_value_error, message = outcome
    raise (ValueError if is_value_error else CheckpointError)(f"on rank 0: {message}")


@contextmanager
def single_process_quiet() -> Iterator[None]:
    """Silence DCP's per-call warning that it runs without a process group.

    Single-process runs are a supported mode here, not a mistake worth a warning on
    every save and load.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .* single process")
        yield
