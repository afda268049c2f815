"""Plan options that change the module before it is distributed, as run components:
activation checkpointing (`plan.activation_checkpointing`) and `plan.compile`."""

from __future__ import annotations

import torch
from torch import nn

from tandem.components.base import Component
from tandem.parallel.compiled import maybe_compile
from tandem.parallel.recompute import checkpoint_blocks


class Recompute(Component):
    """Every block recomputes its activations in backward (parameter names unchanged)."""

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Wrap each block's forward in `torch.utils.checkpoint`."""
        checkpoint_blocks(model)
        return model


class Compile(Component):
    """`nn.Module.compile` in place, where the probe says torch.compile works here. The
    compilation itself happens at the first call, after the plan split the module."""

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Compile lazily, in place."""
        maybe_compile(model, device)
        return model
