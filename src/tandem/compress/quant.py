"""Quantisation-aware training: fake-quantised int8 weights and activations (or int4
weights alone, per group) with a straight-through estimator, and conversion to an int8
model for CPU inference.

Weights are quantised symmetric, per output channel (int8: scale = max |w| / 127,
integers in [-127, 127]) or per group of `group` consecutive input weights of a channel
(int4: scale = max |w| / 7 over the group, integers in [-7, 7]); each quantised layer's
input (int8 only) per tensor, asymmetric uint8 (scale and zero point from the running
range: an exponential average while training, the extremes seen while calibrating). The
rounding's gradient is taken as 1 (the straight-through estimator), so training sees the
quantisation error and learns around it. `convert` replaces each fake-quantised layer by
one that stores the integer weights (as int8) and their scales and computes with exactly
the values the fake-quantised layer used, so the converted model's outputs equal the
trained one's; it computes in float (exportable by torch.export, but no faster).

`kernels` makes the int8 model fast on a CPU: each converted int8 Linear becomes
PyTorch's dynamically quantised Linear (`torch.ao.nn.quantized.dynamic`, the x86/fbgemm
engine's int8 GEMM) holding the same int8 weights and scales; its input is quantised per
call from the batch's own range (uint8 with 7 bits, fbgemm's `reduce_range`) instead of
the calibrated one. ConvNd layers stay as converted: torch.ao's dynamic int8 convolutions
are marked inaccurate by PyTorch itself, and static int8 convolutions need the whole
network's activations quantised. torch.export cannot hold fbgemm's packed weights, so
`emulated` turns such a model back into float ops computing the same int8 arithmetic.
"""

from __future__ import annotations

import warnings
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
DYNAMIC_LEVELS = 127  # fbgemm's dynamic kernels quantise inputs to 7 bits (reduce_range)
MOMENTUM = 0.1


def weight_scale(weight: torch.Tensor) -> torch.Tensor:
    """Per-output-channel symmetric int8 scales, shaped to broadcast against `weight`."""
    amax = weight.detach().abs().reshape(weight.shape[0], -1).amax(1)
    return (amax / WEIGHT_MAX).clamp_min(1e-12).reshape(-1, *[1] * (weight.dim() - 1))


def levels(bits: int) -> int:
    """The largest integer of a symmetric `bits`-bit weight: 127 for 8, 7 for 4."""
    if not 2 <= bits <= 8:
        raise ValueError(f"weight bits {bits}: allowed 2 to 8")
    return (1 << (bits - 1)) - 1


def group_size(weight: torch.Tensor, group: int | None) -> int:
    """The weights sharing a scale: `group` when it divides a channel's inputs (in x
    kernel), else the whole channel."""
    cols = weight[0].numel()
    return group if group and cols % group == 0 else cols


def grouped(weight: torch.Tensor, group: int | None) -> torch.Tensor:
    """`weight` as (out channels, groups, group size)."""
    return weight.reshape(weight.shape[0], -1, group_size(weight, group))


def group_scale(weight: torch.Tensor, bits: int, group: int | None) -> torch.Tensor:
    """Symmetric scales per (channel, group), shaped (out, groups, 1)."""
    amax = grouped(weight.detach(), group).abs().amax(-1, keepdim=True)
    return (amax / levels(bits)).clamp_min(1e-12)


def fake_weight(weight: torch.Tensor, bits: int = 8, group: int | None = None) -> torch.Tensor:
    """`weight` quantised to `bits` per (channel, group) and dequantised; gradient straight."""
    top = levels(bits)
    out = fake_quant(grouped(weight, group), group_scale(weight, bits, group), 0.0, -top, top)
    return out.reshape(weight.shape)


def act_params(low: torch.Tensor, high: torch.Tensor, top: int = ACT_LEVELS
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) of unsigned integers 0..`top` over a range widened to hold 0."""
    low, high = low.clamp(max=0.0), high.clamp(min=0.0)
    scale = ((high - low) / top).clamp_min(1e-12)
    return scale, (-low / scale).round().clamp(0, top)


def fake_quant(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | float, low: int,
               high: int) -> torch.Tensor:
    """Quantise and dequantise `x`; the gradient passes straight through."""
    q = ((x / scale).round() + zero).clamp(low, high)
    return x + ((q - zero) * scale - x).detach()


class FakeQuant(nn.Module):
    """A Linear or ConvNd whose weights are fake-quantised to `bits` (per channel, or per
    `group` of inputs) and, with `activations`, its input to uint8."""

    def __init__(self, layer: nn.Module, bits: int = 8, group: int | None = None,
                 activations: bool = True) -> None:
        super().__init__()
        levels(bits)
        if group is not None and group < 1:
            raise ValueError(f"weight group {group}: must be >= 1 (or None: per channel)")
        self.layer, self.bits, self.group, self.activations = layer, bits, group, activations
        self.register_buffer("act_range", torch.zeros(2))
        self.register_buffer("seen", torch.zeros((), dtype=torch.bool))
        self.calibrating = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training or self.calibrating:
            self._observe(x.detach())
        if self.activations:
            scale, zero = act_params(self.act_range[0], self.act_range[1])
            x = fake_quant(x, scale, zero, 0, ACT_LEVELS)
        return _call(self.layer, x, fake_weight(self.layer.weight, self.bits, self.group))

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
    """A converted layer: integer weights (stored as int8) with scales per channel or
    group, and a fixed input quantiser (int8), per call from the input's range
    (`dynamic`: what fbgemm's dynamic kernels do) or none (weights-only quantisation)."""

    def __init__(self, fake: FakeQuant, dynamic: bool = False) -> None:
        super().__init__()
        layer = fake.layer
        self.shape, self.group = tuple(layer.weight.shape), group_size(layer.weight, fake.group)
        scale = group_scale(layer.weight, fake.bits, fake.group)
        top = levels(fake.bits)
        q = (grouped(layer.weight.detach(), fake.group) / scale).round().clamp(-top, top)
        self.register_buffer("weight_int8", q.reshape(self.shape).to(torch.int8))
        self.register_buffer("weight_scale", scale.float())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())
        self.dynamic, self.quantise_input = dynamic, fake.activations and not dynamic
        if self.quantise_input:
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
        if self.quantise_input:
            q = ((x / self.act_scale).round() + self.act_zero).clamp(0, ACT_LEVELS)
            x = (q - self.act_zero) * self.act_scale
        elif self.dynamic:  # fbgemm's dynamic input quantisation: 7 bits over the range
            scale, zero = act_params(x.min(), x.max(), DYNAMIC_LEVELS)
            x = ((x / scale).round() + zero).clamp(0, DYNAMIC_LEVELS).sub(zero).mul(scale)
        w = self.weight_int8.to(x.dtype).reshape(self.shape[0], -1, self.group)
        w = (w * self.weight_scale).reshape(self.shape)
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


def prepare(model: nn.Module, skip: Sequence[str] = (), bits: int = 8,
            group: int | None = None, activations: bool = True) -> list[str]:
    """Wrap every Linear and ConvNd (but those named in `skip`) in FakeQuant, in place:
    int8 weights and inputs by default; `bits` 4, `group` 32, `activations` False for
    int4 weights alone, per group of 32. A layer whose weight is tied to another module's
    (an output layer sharing its embedding's matrix) is left in float: a quantised copy
    would add to the weights the embedding keeps."""
    from tandem.compress.lowrank import tied

    shared = tied(model)
    skip = (*skip, *(n for n, m in model.named_modules()
                     if isinstance(m, _LAYERS) and id(m.weight) in shared))
    return _swap(model, _LAYERS,
                 lambda m: FakeQuant(m, bits, group, activations), skip)


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
    """Replace every FakeQuant by its int8 layer, in place; ValueError if one that
    quantises its input saw no input."""
    for name, module in model.named_modules():
        if isinstance(module, FakeQuant) and module.activations and not bool(module.seen):
            raise ValueError(f"convert: layer {name!r} never saw an input; train or "
                             "calibrate the model first")
    _swap(model, (FakeQuant,), Int8Layer)
    return model


def _kernel(layer: Int8Layer) -> nn.Module:
    """fbgemm's dynamic int8 Linear holding `layer`'s int8 weights and scales."""
    from torch.ao.nn.quantized import dynamic

    out_features, in_features = layer.shape
    with warnings.catch_warnings():  # quantised tensors: deprecated, still fbgemm's input
        warnings.simplefilter("ignore")
        weight = torch._make_per_channel_quantized_tensor(
            layer.weight_int8, layer.weight_scale.flatten().double(),
            torch.zeros(out_features, dtype=torch.long), 0)
    kernel = dynamic.Linear(in_features, out_features, bias_=layer.bias is not None,
                            dtype=torch.qint8)
    kernel.set_weight_bias(weight, layer.bias)
    return kernel


def kernels(model: nn.Module) -> list[str]:
    """Replace, in place, each converted int8 Linear (per-channel int8 weights) by fbgemm's
    dynamic int8 Linear with the same weights and scales; the names replaced. Its input is
    quantised per call from its own range (7 bits), not the calibrated one."""
    if "x86" in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = "x86"
    return _swap(model, (Int8Layer,), _kernel, [
        n for n, m in model.named_modules() if isinstance(m, Int8Layer) and not (
            m.kind is nn.Linear and m.group == m.shape[1]
            and int(m.weight_int8.abs().max()) <= WEIGHT_MAX
            and (m.quantise_input or m.dynamic))])


def _emulation(kernel: nn.Module) -> Int8Layer:
    weight = kernel.weight()
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=kernel.bias() is not None)
    with torch.no_grad():
        layer.weight.copy_(weight.dequantize())
        if layer.bias is not None:
            layer.bias.copy_(kernel.bias())
    return Int8Layer(FakeQuant(layer, activations=False), dynamic=True)


def emulated(model: nn.Module) -> nn.Module:
    """Replace, in place, each fbgemm dynamic int8 Linear by float ops computing the same
    int8 arithmetic (the input quantised per call to 7 bits), which torch.export can hold."""
    from torch.ao.nn.quantized import dynamic

    _swap(model, (dynamic.Linear,), _emulation)
    return model


def has_kernels(model: nn.Module) -> bool:
    """Whether `model` holds fbgemm's packed int8 layers (which torch.export cannot)."""
    from torch.ao.nn.quantized import dynamic

    return any(isinstance(m, dynamic.Linear) for m in model.modules())


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
