"""The plain-tensor helpers the low-communication strategies share: a model's values as one
flat fp32 vector and back, and state trees copied or merged across ranks."""

from __future__ import annotations

from typing import Any

import torch


def flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """The values of `tensors`, in order, as one flat fp32 vector (a copy)."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def assign(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy the flat vector `flat` back into `tensors` (the inverse of `flat`)."""
    with torch.no_grad():
        for t, part in zip(tensors, torch.split(flat, [t.numel() for t in tensors]),
                           strict=True):
            t.copy_(part.view_as(t))


def cloned(tree: Any) -> Any:
    """`tree` with every tensor copied (and int keys as strings)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {str(k): cloned(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(cloned(v) for v in tree)
    return tree


def overlay(plain: Any, own: Any) -> Any:
    """`own` (this rank's loaded tensors, or its whole state) with the values of `plain`
    (the first rank's) filled in where `own` has none."""
    if isinstance(plain, dict) and isinstance(own, dict):
        return {**plain, **{k: overlay(plain.get(k), v) for k, v in own.items()}}
    return plain if own is None else own
