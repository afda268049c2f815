"""Checkpoints: DCP save/load, manifest + checksums, atomic commit, retention.

A training run uses the CheckpointManager (`manager.py`): named Stateful objects, saved
in the background, restored as a whole. The functions below are the same machinery for
a plain dict of tensors, synchronously::

    state = capture(model, optimizer)
    save(root, step, state, meta={"step": step, ...}, keep=3)   # all ranks
    ...
    path = latest(root)                                          # all ranks
    if path is not None:
        state = capture(model, optimizer)
        meta = load(path, state)
        restore(model, optimizer, state)

Loading never unpickles anything but DCP's own metadata (a restricted unpickler), and
with TANDEM_CHECKPOINT_KEY set every manifest is signed (HMAC-SHA256) and checked.
"""

from tandem.checkpoint.errors import CheckpointError
from tandem.checkpoint.load import latest, load, read_meta, set_aside
from tandem.checkpoint.manager import CheckpointManager, Stateful
from tandem.checkpoint.save import save
from tandem.checkpoint.state import ModelWeights, OptimizerState, capture, restore

__all__ = ["CheckpointError", "CheckpointManager", "ModelWeights", "OptimizerState",
           "Stateful", "capture", "latest", "load", "read_meta", "restore", "save",
           "set_aside"]
