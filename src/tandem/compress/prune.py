"""Structured channel pruning: a gradual schedule of masks during training, and the
masked channels physically removed at export.

torch-pruning's DependencyGraph finds, for the output channels of each Linear and ConvNd,
every parameter slice coupled to them (the next layer's input columns, a norm's affine
entries, the other branch of a residual sum or a concatenation), so the coupled layers stay
consistent. During training a channel is masked by zeroing all of its group's slices after
each optimizer step; export removes them. For layers whose statistics mix channels
(GroupNorm, LayerNorm) a zeroed channel still counts in the statistics, so the removed model
differs slightly from the masked one: evaluate the model after `remove`, as
`tandem compress` does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from tandem.components.base import Component

ROOTS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CHANNEL_LAST_DIM = {"prune_out_channels": 0, "prune_in_channels": 1}


def _pruning() -> Any:
    try:
        import torch_pruning
    except ImportError as err:  # an optional dependency
        raise ValueError("channel pruning needs torch-pruning: pip install 'tandem[compress]'"
                         ) from err
    return torch_pruning


def graph(model: nn.Module, example: Any) -> Any:
    """torch-pruning's dependency graph of `model`, traced on the inputs `example`."""
    return _pruning().DependencyGraph().build_dependency(model, example_inputs=example)


def _groups(model: nn.Module, dep_graph: Any, keep: Sequence[str]) -> dict[str, Any]:
    """{root module name: its group}, one per set of coupled channels."""
    names = {module: name for name, module in model.named_modules()}
    ignored = [model.get_submodule(name) for name in keep]
    groups = dep_graph.get_all_groups(ignored_layers=ignored, root_module_types=list(ROOTS))
    return {names[g[0].dep.target.module]: g for g in groups}


def _multiple(group: Any) -> int:
    """Channels left must be a multiple of this (each GroupNorm's group count)."""
    out = 1
    for item in group:
        module = item.dep.target.module
        if isinstance(module, nn.GroupNorm):
            out = math.lcm(out, module.num_groups)
    return out


@torch.no_grad()
def _zero(group: Any) -> None:
    for item in group:
        module, handler = item.dep.target.module, item.dep.handler.__name__
        idxs = torch.as_tensor(list(item.idxs), dtype=torch.long)
        if isinstance(module, ROOTS):
            if getattr(module, "groups", 1) != 1:
                raise ValueError(f"pruning: grouped convolution {module} is not supported")
            module.weight.index_fill_(_CHANNEL_LAST_DIM[handler], idxs, 0.0)
            if handler == "prune_out_channels" and module.bias is not None:
                module.bias.index_fill_(0, idxs, 0.0)
        elif isinstance(module, (nn.GroupNorm, nn.LayerNorm, nn.modules.batchnorm._NormBase)):
            for tensor in (module.weight, module.bias):
                if tensor is not None:
                    tensor.index_fill_(0, idxs, 0.0)
        elif not _maskable(module):
            raise ValueError(f"pruning: {type(module).__name__} is coupled to pruned channels "
                             "and has parameters tandem cannot mask; give its producer in "
                             "`keep`")


def _maskable(module: Any) -> bool:
    """Whether `_zero` can mask a coupled module's slices: a (plain) Linear or ConvNd, a
    norm's affine entries, or a module without parameters of its own."""
    if isinstance(module, ROOTS):
        return getattr(module, "groups", 1) == 1
    if isinstance(module, (nn.GroupNorm, nn.LayerNorm, nn.modules.batchnorm._NormBase)):
        return True
    if not isinstance(module, nn.Module):  # a bare parameter (a position table)
        return False
    return not any(True for _ in module.parameters(recurse=False))


def tied(model: nn.Module, example: Any, keep: Sequence[str] = (),
         dep_graph: Any = None) -> list[str]:
    """Roots of the channel groups that couple a layer tandem cannot mask (an embedding or
    a bare parameter on a residual stream: every block's output is tied to it), which
    `keep` must name for the others to be pruned."""
    dep_graph = dep_graph or graph(model, example)
    return sorted(name for name, group in _groups(model, dep_graph, keep).items()
                  if not all(_maskable(item.dep.target.module) for item in group))


def choose(model: nn.Module, example: Any, ratio: float, keep: Sequence[str] = (),
           masked: dict[str, list[int]] | None = None,
           dep_graph: Any = None) -> dict[str, list[int]]:
    """Channels to mask so that `ratio` of each group's channels are masked: the masked
    ones stay masked, the others with the lowest group L2 norm follow."""
    if not 0 <= ratio < 1:
        raise ValueError(f"pruning ratio {ratio} must be in [0, 1)")
    importance = _pruning().importance.GroupMagnitudeImportance(p=2)
    masked = masked or {}
    out: dict[str, list[int]] = {}
    dep_graph = dep_graph or graph(model, example)
    for name, group in _groups(model, dep_graph, keep).items():
        score = importance(group).clone()
        channels, step = len(score), _multiple(group)
        kept = max(step, step * math.ceil(channels * (1 - ratio) / step))
        already = masked.get(name, [])
        score[already] = -math.inf
        out[name] = sorted(score.argsort()[: channels - kept].tolist())
        if len(out[name]) < len(already):
            out[name] = sorted(already)
    return out


def apply(model: nn.Module, example: Any, masked: dict[str, list[int]],
          dep_graph: Any = None) -> None:
    """Zero the slices of every masked channel's group (in place)."""
    dep_graph = dep_graph or graph(model, example)
    for name, idxs in masked.items():
        if idxs:
            module = model.get_submodule(name)
            handler = dep_graph.get_pruner_of_module(module).prune_out_channels
            _zero(dep_graph.get_pruning_group(module, handler, idxs=list(idxs)))


def remove(model: nn.Module, example: Any, masked: dict[str, list[int]]) -> nn.Module:
    """Physically remove the masked channels and their coupled slices (in place)."""
    for name, idxs in masked.items():
        if idxs:
            dep_graph = graph(model, example)
            module = model.get_submodule(name)
            handler = dep_graph.get_pruner_of_module(module).prune_out_channels
            dep_graph.get_pruning_group(module, handler, idxs=list(idxs)).prune()
    return model


def cubic(step: int, ratio: float, start: int, end: int) -> float:
    """The share masked at `step`: 0 before `start`, rising as 1 - (1 - t)^3 to `ratio`
    at `end` (Zhu & Gupta's gradual schedule)."""
    if step <= start:
        return 0.0
    t = min(1.0, (step - start) / max(1, end - start))
    return ratio * (1 - (1 - t) ** 3)


class ChannelPruning(Component):
    """Masks a growing share of each layer group's channels on the cubic schedule, every
    `every` steps from `start` to `end`; the masks are its checkpointed state. `example`:
    inputs the model can be traced on (one batch's inputs), on the run's device."""

    name = "pruning"

    def __init__(self, example: Any, ratio: float, start: int, end: int, every: int = 1,
                 keep: Sequence[str] = ()) -> None:
        if not 0 < ratio < 1:
            raise ValueError(f"ChannelPruning: ratio={ratio} must be in (0, 1)")
        if not 0 <= start <= end or every < 1:
            raise ValueError(f"ChannelPruning: need 0 <= start ({start}) <= end ({end}) and "
                             f"every ({every}) >= 1")
        self.example, self.ratio, self.start, self.end = example, ratio, start, end
        self.every, self.keep = every, tuple(keep)
        self.masked: dict[str, list[int]] = {}
        self.module: nn.Module | None = None
        self.graph: Any = None
        self.channels: dict[str, int] = {}

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Trace the module's channel groups; its channels are masked in place."""
        self.module, self.graph = model, graph(model, self.example)
        self.channels = {name: len(g[0].idxs)
                         for name, g in _groups(model, self.graph, self.keep).items()}
        return model

    def after_step(self, step: int, skipped: bool) -> None:
        """Mask more channels on schedule steps; re-zero the masked slices every step."""
        assert self.module is not None, "transform_model was not called"
        if (step - self.start) % self.every == 0 or step == self.end:
            share = cubic(step, self.ratio, self.start, self.end)
            if share > 0:
                self.masked = choose(self.module, self.example, share, self.keep,
                                     self.masked, self.graph)
        apply(self.module, self.example, self.masked, self.graph)

    def metrics(self) -> dict[str, float]:
        """The share of prunable channels masked."""
        return {"pruned_share": sum(map(len, self.masked.values()))
                / max(1, sum(self.channels.values()))}

    def state_dict(self) -> dict[str, Any]:
        """One 0/1 mask per group root (1: masked), of the root's channel count."""
        out = {}
        for name, count in self.channels.items():
            mask = torch.zeros(count, dtype=torch.uint8)
            mask[self.masked.get(name, [])] = 1
            out[name] = mask
        return {"masked": out}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the masked channels."""
        self.masked = {name: mask.nonzero().flatten().tolist()
                       for name, mask in state["masked"].items()}
