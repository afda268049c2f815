"""Optimizers for large batches and fast convergence, and learning-rate schedules."""

from tandem.optim.lamb import LAMB
from tandem.optim.lars import LARS
from tandem.optim.muon import Muon

__all__ = ["LAMB", "LARS", "Muon"]
