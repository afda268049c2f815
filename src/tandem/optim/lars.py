"""LARS: SGD with momentum and a layer-wise trust ratio (You et al. 2017)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tandem.optim.layerwise import LayerwiseOptimizer, check_range


class LARS(LayerwiseOptimizer):
    """Layer-wise Adaptive Rate Scaling, as in Algorithm 1 of You et al. 2017.

    For each adapted parameter w with gradient g:

        local = trust_coefficient * ||w|| / (||g|| + weight_decay * ||w|| + eps)
        v     = momentum * v + lr * local * (g + weight_decay * w)
        w     = w - v

    `local` is 1 when ||w|| or ||g|| is 0: a zero-initialised layer would otherwise never
    move, and a layer without gradient has nothing to scale. With
    `exclude_bias_and_norm`, parameters with ndim <= 1 (biases, norm scales and shifts)
    get neither the trust ratio nor weight decay (plain momentum SGD), the usual practice
    since their norms say nothing about a layer's scale.

    Only tensor ops, no `.item()`: no host synchronisation per parameter, and DTensor
    (FSDP2) parameters work, the norms being reduced over the shards by DTensor.
    """

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001,
                 eps: float = 1e-8, exclude_bias_and_norm: bool = True) -> None:
        check_range("lr", lr, 0.0)
        check_range("momentum", momentum, 0.0, 1.0)
        check_range("weight_decay", weight_decay, 0.0)
        if trust_coefficient <= 0:
            raise ValueError(
                f"trust_coefficient: {trust_coefficient!r} is out of range; expected a number > 0"
            )
        check_range("eps", eps, 0.0)
        defaults = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                    "trust_coefficient": trust_coefficient, "eps": eps,
                    "exclude_bias_and_norm": exclude_bias_and_norm}
        super().__init__(params, defaults)

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        if grad.is_sparse:
            raise ValueError("LARS: sparse gradients are not supported; use dense gradients")
        adapt = not (group["exclude_bias_and_norm"] and param.ndim <= 1)
        if adapt:
            decay = group["weight_decay"]
            w_norm = torch.linalg.vector_norm(param)
            g_norm = torch.linalg.vector_norm(grad)
            ratio = group["trust_coefficient"] * w_norm / (g_norm + decay * w_norm + group["eps"])
            local = torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))
            update = grad.add(param, alpha=decay) if decay else grad.clone()
            update.mul_(local * group["lr"])
        else:
            update = grad.mul(group["lr"])
        if group["momentum"] == 0:
            param.sub_(update)
            return
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        buffer = state["momentum_buffer"]
        buffer.mul_(group["momentum"]).add_(update)
        param.sub_(buffer)
