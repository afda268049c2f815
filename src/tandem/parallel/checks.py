"""What the model factory must hand over."""

from __future__ import annotations

from typing import Any

from torch import nn


def check_model(model: Any) -> nn.Module:
    """The model factory's product must be an nn.Module with parameters to train."""
    if not isinstance(model, nn.Module):
        raise ValueError(f"Task.model must return an nn.Module, got {type(model).__name__}")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"Task.model returned a {type(model).__name__} with no trainable "
                         "parameters")
    return model
