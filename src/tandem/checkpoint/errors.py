"""The one exception the checkpoint subsystem raises for unusable checkpoints."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or used; the message names the file and problem."""
