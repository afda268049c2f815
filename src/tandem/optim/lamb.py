"""LAMB: Adam moments with a layer-wise trust ratio (You et al. 2019)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from tandem.optim.layerwise import LayerwiseOptimizer, check_range


class LAMB(LayerwiseOptimizer):
    """Layer-wise Adaptive Moments for Batch training, as in You et al. 2019.

    For each parameter w with gradient g, at step t (from 1):

        m = beta1 * m + (1 - beta1) * g          m_hat = m / (1 - beta1^t)
        v = beta2 * v + (1 - beta2) * g^2        v_hat = v / (1 - beta2^t)
        r = m_hat / (sqrt(v_hat) + eps) + weight_decay * w
        w = w - lr * (||w|| / ||r||) * r

    The trust ratio ||w|| / ||r|| is 1 when either norm is 0 (a zero-initialised layer
    must still move). Only tensor ops, no `.item()` on device tensors: DTensor (FSDP2)
    parameters work, their norms reduced over the shards by DTensor. The step count is a
    CPU scalar tensor, as in torch's Adam, so state dicts hold tensors only.
    """

    def __init__(self, params: Iterable[Any], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6,
                 weight_decay: float = 0.0) -> None:
        check_range("lr", lr, 0.0)
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        check_range("eps", eps, 0.0)
        check_range("weight_decay", weight_decay, 0.0)
        defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _state(self, param: torch.Tensor) -> dict[str, Any]:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        return state

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        if grad.is_sparse:
            raise ValueError("LAMB: sparse gradients are not supported; use dense gradients")
        state = self._state(param)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        step = float(state["step"])  # a CPU tensor: no device synchronisation
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq / (1 - beta2**step)).sqrt_().add_(group["eps"])
        update = (exp_avg / (1 - beta1**step)).div_(denom)
        if group["weight_decay"]:
            update.add_(param, alpha=group["weight_decay"])
        w_norm = torch.linalg.vector_norm(param)
        r_norm = torch.linalg.vector_norm(update)
        trust = torch.where((w_norm > 0) & (r_norm > 0), w_norm / r_norm,
                            torch.ones_like(w_norm))
        param.sub_(update.mul_(trust * group["lr"]))
