"""Optimizers for large batches and fast convergence, and learning-rate schedules."""

from tandem.optim.lamb import LAMB
from tandem.optim.lars import LARS
from tandem.optim.muon import Muon

__all__ = ["LAMB", "LARS", "Muon", "share_work"]


def share_work(optimizer: object, strategy: object, layout: object) -> None:
    """Let an optimizer that can split its work among identical replicas (e.g. `Muon`) do
    so: data parallel with more than one replica, every replica holding whole weights."""
    share = getattr(optimizer, "share_work", None)
    if share is not None and strategy.identical_replicas and layout.dp_size > 1:
        share(layout.dp_group, strategy.shared_memory())
