"""Capture and restore model + optimizer state in the form DCP saves and reshards."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.optim import Optimizer


def capture(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Return ``{"model": ..., "optim": ...}`` for a plain, DDP or FSDP2 model.

    Keys are the unwrapped module's names (no ``module.`` prefix from DDP), so a
    checkpoint moves between wrappings. Must be called on all ranks for FSDP2. On a
    fresh optimizer this creates its state with a zero-gradient, zero-lr step, so call
    it before the first backward when capturing a target to load into.
    """
    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def restore(model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
    """Copy a loaded ``{"model": ..., "optim": ...}`` state into the model and optimizer."""
    for key in ("model", "optim"):
        if key not in state:
            raise ValueError(f"state must have a {key!r} entry, got keys {sorted(state)}")
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )



class ModelWeights:
    """The model's weights as a Stateful (section "model": unwrapped names)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        """The weights; DTensor shards stay shards (DCP reshards them)."""
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy loaded weights in."""
        set_model_state_dict(self.model, state)


class OptimizerState:
    """The optimizer's state as a Stateful (section "optim", keyed by parameter names)."""

    def __init__(self, model: nn.Module, optimizer: Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        """Moments and step counts by parameter name, and the param groups. On a fresh
        optimizer this creates its state with a zero-gradient, zero-lr step."""
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy loaded optimizer state in."""
        set_optimizer_state_dict(self.model, self.optimizer, state)
