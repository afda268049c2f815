"""Activation checkpointing per block: keep a block's input, recompute its inside in backward."""

from __future__ import annotations

import functools
import logging

from torch import nn
from torch.utils.checkpoint import checkpoint

from tandem.parallel.blocks import find_blocks

log = logging.getLogger("tandem")


def checkpoint_blocks(model: nn.Module) -> int:
    """Make every block of `model` (see `fsdp.find_blocks`) recompute its activations.

    Each block's forward runs under `torch.utils.checkpoint` (non-reentrant), so only the
    block's inputs are kept for backward, which runs the block's forward again first. The
    module tree and parameter names do not change (checkpoints stay interchangeable with
    runs without it). Returns the number of blocks.
    """
    blocks = find_blocks(model)
    if not blocks:
        raise ValueError(f"plan.activation_checkpointing: {type(model).__name__} has no "
                         "blocks (children of an nn.ModuleList or nn.Sequential with "
                         "parameters) to checkpoint")
    for block in blocks:
        forward = block.forward

        @functools.wraps(forward)
        def recomputed(*args, _forward=forward, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = recomputed
    log.debug("activation checkpointing on %d blocks", len(blocks))
    return len(blocks)
