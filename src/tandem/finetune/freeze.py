"""`train.freeze`: parameters whose names match glob patterns take no gradient.

Frozen before the model is distributed, so DDP leaves them out of its buckets (no
`find_unused_parameters`), FSDP2 shards them without reducing a gradient, and the
optimizer never holds them (the trainer passes it the trainable parameters only). Names
are the user's module's, as `model.named_parameters()` gives them (e.g. `0.weight`,
`encoder.layers.3.attn.q.weight`); patterns are `fnmatch` globs (`*` crosses dots).
"""

from __future__ import annotations

import fnmatch
import logging

import torch
from torch import nn

from tandem.components.base import Component

log = logging.getLogger(__name__)


def parse_patterns(text: str) -> list[str]:
    """'0.*, 1.*' -> ['0.*', '1.*'] (empty entries dropped)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def frozen_names(model: nn.Module, patterns: list[str]) -> list[str]:
    """The parameter names the patterns match. ValueError when a pattern matches nothing
    or when they match every parameter (nothing would train), naming what exists."""
    names = [name for name, _ in model.named_parameters()]
    matched: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(names, pattern)
        if not hits:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(f"train.freeze: pattern {pattern!r} matches no parameter; the "
                             f"model's parameters are named {shown}")
        matched.update(hits)
    if len(matched) == len(names):
        raise ValueError(f"train.freeze: {patterns} freeze every parameter of the model; "
                         "leave at least one to train")
    return [n for n in names if n in matched]


class Freeze(Component):
    """Sets requires_grad False on the parameters `train.freeze` names."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = patterns
        self.frozen: list[str] = []

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Freeze the matching parameters in place."""
        self.frozen = frozen_names(model, self.patterns)
        params = dict(model.named_parameters())
        for name in self.frozen:
            params[name].requires_grad_(False)
        total = sum(p.numel() for p in params.values())
        kept = sum(params[n].numel() for n in self.frozen)
        log.info("train.freeze: %d of %d parameter tensors frozen (%.1f%% of %d weights); "
                 "%d weights train", len(self.frozen), len(params), 100 * kept / total,
                 total, total - kept)
        return model
