"""Mixed precision: autocast and dynamic loss scaling behind one small interface."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from tandem.config import PrecisionConfig
from tandem.trainer.attention import FullPrecisionAttention, resolve

NormOf = Callable[[list[torch.nn.Parameter], float], torch.Tensor]  # Strategy.grad_norm


class Precision:
    """Runs forward passes under the chosen autocast and steps through a loss scaler.

    fp32: nothing changes. bf16: autocast, no scaling (bf16 has fp32's range).
    fp16: autocast plus torch's GradScaler, which skips steps whose gradients
    overflow and adapts the scale. Under either autocast, attention computes in fp32 where
    `precision.attention` resolves to fp32 (`tandem.trainer.attention`).
    """

    def __init__(self, cfg: PrecisionConfig, device: torch.device) -> None:
        self.mode = cfg.mode
        self.device = device
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(cfg.mode)
        self.dtype = dtype
        self.attention = resolve(cfg.attention, device) if dtype is not None else "fp32"
        self.attends: bool | None = None  # whether the model calls attention (first forward)
        self.scaler = torch.amp.GradScaler(
            device.type,
            init_scale=cfg.init_scale,
            growth_interval=cfg.growth_interval,
            enabled=cfg.mode == "fp16",
        )

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """The forward context of the chosen precision."""
        if self.dtype is None:
            yield
            return
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.autocast(device_type=self.device.type, dtype=self.dtype))
            mode = None
            if self.attention == "fp32" and self.attends is not False:
                mode = stack.enter_context(FullPrecisionAttention(self.device.type))
            yield
            if mode is not None and self.attends is None:
                # The first forward (the preflight's) tells whether the model attends at
                # all: one that does not skips the mode, which costs every op a Python call
                # (a visible share of a small model's step).
                self.attends = mode.calls > 0

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the (scaled, when fp16) loss."""
        self.scaler.scale(loss).backward()

    def grad_norm(self, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                  max_norm: float, norm_of: NormOf) -> torch.Tensor:
        """The true (unscaled) global gradient norm; clip to `max_norm` when it is > 0.

        Called after the gradients are complete (all-reduced, accumulated), so the norm
        (the strategy's `norm_of`) is the same on every rank.
        """
        self.scaler.unscale_(optimizer)
        return norm_of(params, max_norm)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer (skipped by the scaler if fp16 gradients overflowed)."""
        self.scaler.step(optimizer)
        self.scaler.update()

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 when no scaling is in use)."""
        return float(self.scaler.get_scale()) if self.scaler.is_enabled() else 1.0

    def state_dict(self) -> dict[str, Any]:
        """Scaler state as JSON-ready values."""
        state = self.scaler.state_dict()
        return {k: (float(v) if isinstance(v, float) else v) for k, v in state.items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore scaler state saved by `state_dict`."""
        if state and self.scaler.is_enabled():
            scale = state.get("scale")
            if scale is not None and not math.isfinite(scale):
                raise ValueError(f"checkpoint holds a non-finite loss scale {scale}")
            self.scaler.load_state_dict(state)
