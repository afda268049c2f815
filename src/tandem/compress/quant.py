"""Quantisation-aware training: fake-quantised int8 weights and activations with a
straight-through estimator, and conversion to an int8 model for CPU inference.

Weights are quantised per output channel, symmetric (scale = max |w| / 127, integers in
[-127, 127]); each quantised layer's input per tensor, asymmetric uint8 (scale and zero
point from the running range: an exponential average while training, the extremes seen
while calibrating). The rounding's gradient is taken as 1 (the straight-through
estimator), so training sees the quantisation error and learns around it. `convert`
replaces each fake-quantised layer by one that stores int8 weights and their scales (a
quarter of the float bytes) and computes with exactly the values the fake-quantised
layer used, so the converted model's outputs equal the trained one's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tandem.components.base import Component

_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_FN = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}
WEIGHT_MAX = 127
ACT_LEVELS = 255
MOMENTUM = 0.1


def weight_scale(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric int8 scales, shaped to broadcast against `weight`."""
    amax = weight.detach().abs().reshape(weight.shape[0], -1).amax(1)
    return (amax / WEIGHT_MAX).clamp_min(1e-12).reshape(-1, *[1] * (weight.dim() - 1))


def act_params(low: torch.Tensor, high: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) of uint8 over a range widened to hold 0."""
    low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    scale = ((high - low) / ACT_LEVELS).clamp_min(1e-12)
    return scale, (-low / scale).round().clamp(0, ACT_LEVELS)


def fake_quant(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | float, low: int,
               high: int) -> torch.Tensor:
    """Quantise and dequantise `x`; the gradient passes straight through."""
    q = ((x / scale).round() + zero).clamp(low, high)
    return x + ((q - zero) * scale - x).detach()


class FakeQuant(nn.Module):
    """A Linear or ConvNd whose weights and input are fake-quantised to int8."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("act_range", torch.zeros(2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))
        self.calibrating = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.calibrating:
            self._observe(x.detach())
        scale, zero = act_params(self.act_range[0], self.act_range[1])
        x = fake_quant(x, scale, zero, 0, ACT_LEVELS)
        w = self.layer.weight
        w = fake_quant(w, weight_scale(w), 0.0, -WEIGHT_MAX, WEIGHT_MAX)
        return _call(self.layer, x, w)

    @torch.no_grad()
    def _observe(self, x: torch.Tensor) -> None:
        now = torch.stack([x.min(), x.max()]).float()
        if not self.seen:
            self.act_range.copy_(now)
            self.seen.fill_(True)
        elif self.calibrating:
            self.act_range.copy_(torch.stack([self.act_range[0].minimum(now[0]),
                                              self.act_range[1].maximum(now[1])]))
        else:
            self.act_range.lerp_(now, MOMENTUM)


class Int8Layer(nn.Module):
    """A converted layer: int8 weights with per-channel scales, a fixed input quantiser."""

    def __init__(self, fake: FakeQuant) -> None:
        super().__init__()
        layer = fake.layer
        scale = weight_scale(layer.weight)
        q = (layer.weight.detach() / scale).round().clamp(-WEIGHT_MAX, WEIGHT_MAX)
        self.register_buffer("weight_int8", q.to(torch.int8))
        self.register_buffer("weight_scale", scale.float())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())
        act_scale, act_zero = act_params(fake.act_range[0], fake.act_range[1])
        self.register_buffer("act_scale", act_scale.clone())
        self.register_buffer("act_zero", act_zero.clone())
        self.kind = type(layer)
        self.conv = {} if isinstance(layer, nn.Linear) else {
            "stride": layer.stride, "padding": layer.padding, "dilation": layer.dilation,
            "groups": layer.groups}
        if not isinstance(layer, nn.Linear) and layer.padding_mode != "zeros":
            raise ValueError(f"convert: padding_mode {layer.padding_mode!r} is not supported; "
                             "only 'zeros'")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = ((x / self.act_scale).round() + self.act_zero).clamp(0, ACT_LEVELS)
        x = (q - self.act_zero) * self.act_scale
        w = self.weight_int8.to(x.dtype) * self.weight_scale
        if self.kind is nn.Linear:
            return F.linear(x, w, self.bias)
        return _CONV_FN[self.kind](x, w, self.bias, **self.conv)


def _call(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if isinstance(layer, nn.Linear):
        return F.linear(x, weight, layer.bias)
    return layer._conv_forward(x, weight, layer.bias)


def _swap(model: nn.Module, kinds: tuple[type, ...], make: Any,
          skip: Sequence[str] = ()) -> list[str]:
    done = []
    for name, module in list(model.named_modules()):
        if isinstance(module, kinds) and name not in skip and not _inside(name, done):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, make(module))
            done.append(name)
    return done


def _inside(name: str, done: Sequence[str]) -> bool:
    return any(name.startswith(d + ".") for d in done)


def prepare(model: nn.Module, skip: Sequence[str] = ()) -> list[str]:
    """Wrap every Linear and ConvNd (but those named in `skip`) in FakeQuant, in place."""
    return _swap(model, _LAYERS, FakeQuant, skip)


@contextmanager
def calibrating(model: nn.Module) -> Iterator[None]:
    """Forwards inside record each quantised input's extremes (post-training calibration)."""
    fakes = [m for m in model.modules() if isinstance(m, FakeQuant)]
    for m in fakes:
        m.calibrating = True
    try:
        yield
    finally:
        for m in fakes:
            m.calibrating = False


def convert(model: nn.Module) -> nn.Module:
    """Replace every FakeQuant by its int8 layer, in place; ValueError if one saw no input."""
    for name, module in model.named_modules():
        if isinstance(module, FakeQuant) and not bool(module.seen):
            raise ValueError(f"convert: layer {name!r} never saw an input; train or "
                             "calibrate the model first")
    _swap(model, (FakeQuant,), Int8Layer)
    return model


def quantised_names(model: nn.Module) -> Iterable[str]:
    """Names of the fake-quantised layers."""
    return [n for n, m in model.named_modules() if isinstance(m, FakeQuant)]


class QuantAware(Component):
    """Trains the run's model with int8 fake quantisation (weights and activations)."""

    name = "quant_aware"

    def __init__(self, skip: Sequence[str] = ()) -> None:
        self.skip = tuple(skip)

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Wrap the Linear and ConvNd layers in FakeQuant."""
        if not prepare(model, self.skip):
            raise ValueError("QuantAware: the model has no Linear or ConvNd layer to quantise")
        return model

    def rebuilt(self, model: nn.Module) -> nn.Module:
        """The same FakeQuant wrappers on a fresh build (the trained model handed back)."""
        prepare(model, self.skip)
        return model
