"""Low-rank factorisation of Linear and Conv layers, initialised from a truncated SVD.

A Linear (out x in) becomes Linear(in -> r, no bias) then Linear(r -> out); a ConvNd
(out x in x k...) becomes ConvNd(in -> r, the same kernel, stride, padding and dilation)
then a pointwise ConvNd(r -> out). With W = U S V^T, the first factor is sqrt(S) V^T and
the second U sqrt(S), so the pair reproduces the best rank-r approximation of W
(Eckart-Young). The rank is chosen per layer by the singular-value energy kept
(`energy`: sum of the kept S^2 over the total) or by the share of the layer's weights
the pair may hold (`params`); a layer is left whole when the pair would not be smaller,
or when its weight is tied to another module's (an output layer sharing its embedding's
matrix).
"""

from __future__ import annotations

import math

import torch
from torch import nn

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _matrix(layer: nn.Module) -> torch.Tensor:
    """The layer's weight as (out, in * kernel)."""
    return layer.weight.detach().reshape(layer.weight.shape[0], -1).float()


def rank_for(singular: torch.Tensor, shape: tuple[int, int], energy: float | None,
             params: float | None) -> int:
    """The rank kept for a (rows x cols) weight with singular values `singular`."""
    rows, cols = shape
    if energy is not None:
        kept = torch.cumsum(singular.double() ** 2, 0) / (singular.double() ** 2).sum()
        return int(torch.searchsorted(kept, torch.tensor(energy, dtype=kept.dtype)).item()) + 1
    assert params is not None
    return max(1, math.floor(params * rows * cols / (rows + cols)))


def _factors(layer: nn.Module, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    u, s, vh = torch.linalg.svd(_matrix(layer), full_matrices=False)
    root = s[:rank].sqrt()
    return root[:, None] * vh[:rank], u[:, :rank] * root[None, :]


def factorise_layer(layer: nn.Module, rank: int) -> nn.Sequential:
    """The rank-`rank` pair that replaces a Linear or a (groups=1) ConvNd layer."""
    first_w, second_w = _factors(layer, rank)
    dtype = layer.weight.dtype
    if isinstance(layer, nn.Linear):
        first = nn.Linear(layer.in_features, rank, bias=False)
        second = nn.Linear(rank, layer.out_features, bias=layer.bias is not None)
        first.weight.data.copy_(first_w)
        second.weight.data.copy_(second_w)
    else:
        conv = type(layer)
        first = conv(layer.in_channels, rank, layer.kernel_size, stride=layer.stride,
                     padding=layer.padding, dilation=layer.dilation, bias=False,
                     padding_mode=layer.padding_mode)
        second = conv(rank, layer.out_channels, 1, bias=layer.bias is not None)
        first.weight.data.copy_(first_w.reshape(first.weight.shape))
        second.weight.data.copy_(second_w.reshape(second.weight.shape))
    if layer.bias is not None:
        second.bias.data.copy_(layer.bias.detach())
    return nn.Sequential(first, second).to(dtype=dtype, device=layer.weight.device)


def factorise(model: nn.Module, energy: float | None = None, params: float | None = None,
              skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Replace, in place, each Linear and ConvNd whose pair is smaller by its low-rank pair.

    Give exactly one of `energy` (0 < e <= 1: the share of singular-value energy kept)
    or `params` (0 < p < 1: the pair's weights as a share of the layer's). `skip` names
    modules to leave whole. Returns {module name: rank} of the layers replaced.
    """
    if (energy is None) == (params is None):
        raise ValueError("factorise: give exactly one of energy= or params=")
    if energy is not None and not 0 < energy <= 1:
        raise ValueError(f"factorise: energy={energy} must be in (0, 1]")
    if params is not None and not 0 < params < 1:
        raise ValueError(f"factorise: params={params} must be in (0, 1)")
    chosen: dict[str, int] = {}
    shared = tied(model)
    for name, layer in list(model.named_modules()):
        if name in skip or not _factorable(layer) or id(layer.weight) in shared:
            continue
        matrix = _matrix(layer)
        rows, cols = matrix.shape
        rank = rank_for(torch.linalg.svdvals(matrix), (rows, cols), energy, params)
        if rank * (rows + cols) >= rows * cols:
            continue
        _replace(model, name, factorise_layer(layer, rank))
        chosen[name] = rank
    return chosen


def tied(model: nn.Module) -> set[int]:
    """Ids of the parameters held by more than one module (a language model's output
    layer tied to its embedding): left whole, for the pair would add weights, not save
    them, while the embedding keeps the full matrix."""
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def _factorable(layer: nn.Module) -> bool:
    if isinstance(layer, nn.Linear):
        return True
    return isinstance(layer, _CONVS) and layer.groups == 1


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
