"""Checkpoints: DCP save/load, manifest + checksums, atomic commit, retention.

The trainer's cycle::

    state = capture(model, optimizer)
    save(root, step, state, meta={"step": step, ...}, keep=3)   # all ranks
    ...
    path = latest(root)                                          # all ranks
    if path is not None:
        state = capture(model, optimizer)
        meta = load(path, state)
        restore(model, optimizer, state)
"""

from tandem.checkpoint.errors import CheckpointError
from tandem.checkpoint.load import latest, load, read_meta, set_aside
from tandem.checkpoint.save import save
from tandem.checkpoint.state import capture, restore

__all__ = ["CheckpointError", "capture", "latest", "load", "read_meta", "restore", "save",
           "set_aside"]
