"""Optimizers for large batches and learning-rate schedules."""

from tandem.optim.lamb import LAMB
from tandem.optim.lars import LARS

__all__ = ["LAMB", "LARS"]
