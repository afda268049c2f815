"""What a model costs, measured on the meta device (no memory, no real compute): per unit
(the parts a pipeline cuts along: before the blocks, each block, after them), its
parameters, the FLOPs of its forward and the bytes autograd saves for its backward, for
one sample.

The forward runs on meta tensors of a real first micro-batch's shapes: the saved bytes are
what autograd keeps (parameters, which it saves by reference, excluded), the FLOPs those
torch's counter sees (matmuls, convolutions). A backward costs two forwards.

`F.scaled_dot_product_attention` is counted as a fused (flash) kernel runs it: it keeps
its inputs, its output and one float per query and head, never the probabilities (on the
meta device torch would take the unfused path, which keeps them: s^2 per head).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, _FlopCounterMode

from tandem.parallel.stages import units


@dataclass(frozen=True)
class Unit:
    """One unit of the model: a block, or the parts before or after the blocks."""

    name: str
    params: int
    flops: float  # forward FLOPs per sample
    saved_bytes: float  # bytes autograd keeps for the backward, per sample (fp32)
    is_block: bool


@dataclass(frozen=True)
class ModelProfile:
    """The model's units in forward order, and the activation crossing a block boundary."""

    units: tuple[Unit, ...]
    boundary_bytes: float  # a block's input per sample (fp32): what recomputation keeps
    tp_params: int  # parameters in the layers the task's tensor-parallel plan splits

    @property
    def params(self) -> int:
        return sum(u.params for u in self.units)

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample."""
        return sum(u.flops for u in self.units)


def _to_meta(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return torch.empty_like(batch, device="meta")
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_meta(b) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_meta(v) for k, v in batch.items()}
    return batch


def profile(build: Callable[[], nn.Module], batch: Any, samples: int,
            forward: Callable[[nn.Module, Any], Any],
            tensor_parallel: dict[str, str] | None = None) -> ModelProfile:
    """Profile the model `build` makes on `batch` (`samples` samples), run by `forward`."""
    with torch.device("meta"):
        model = build()
    try:
        before, blocks, after = units(model)
    except ValueError:  # no block list: the whole model is one unit (no pipeline)
        before, blocks, after = [""], [], []
    order = [*before, *blocks, *after]
    params = {n: _unit_params(model, n) for n in order}
    owned = {id(p) for p in model.parameters()}
    flops = dict.fromkeys(order, 0.0)
    saved = dict.fromkeys(order, 0.0)
    boundary: list[float] = []
    counter = FlopCounterMode(display=False)
    current: list[str] = []
    last = [order[0]] if order else [""]  # where saved tensors outside any unit go
    seen: set[int] = set()

    def enter(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            current.append(name)
            last[0] = name
            flops[name] -= counter.get_total_flops()
            if name in blocks and args and isinstance(args[0], torch.Tensor):
                boundary.append(args[0].numel() * 4.0)
        return hook

    def leave(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            flops[name] += counter.get_total_flops()
            current.pop()
        return hook

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if id(t) not in seen and id(base) not in owned:
            seen.add(id(t))
            # Outside every unit (the root's own ops, the loss): the unit that ran last.
            saved[current[-1] if current else last[0]] += t.numel() * 4.0  # as fp32
        return t

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any,
                  **kwargs: Any) -> torch.Tensor:
        out = torch.empty(*q.shape[:-1], v.shape[-1], device=q.device, dtype=q.dtype,
                          requires_grad=True)
        where = current[-1] if current else last[0]
        saved[where] += (q.numel() + k.numel() + v.numel() + out.numel()
                         + q.numel() // q.shape[-1]) * 4.0
        score_macs = q.numel() * k.shape[-2] + out.numel() * k.shape[-2]
        flops[where] += 2.0 * score_macs  # QK^T and PV (no causal saving, as torch counts)
        return out

    handles = []
    for name in order:
        module = _module_of(model, name)
        if module is not None:
            handles += [module.register_forward_pre_hook(enter(name)),
                        module.register_forward_hook(leave(name))]
    fused = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = attention
    try:
        with _FlopCounterMode(counter), torch.autograd.graph.saved_tensors_hooks(pack,
                                                                                 lambda t: t):
            forward(model, _to_meta(batch))
    finally:
        torch.nn.functional.scaled_dot_product_attention = fused
        for h in handles:
            h.remove()
    per = 1.0 / samples
    out = tuple(Unit(n, params[n], flops[n] * per, saved[n] * per, n in blocks) for n in order)
    tp = _tp_params(model, tensor_parallel or {})
    return ModelProfile(out, (boundary[0] * per) if boundary else 0.0, tp)


def _module_of(model: nn.Module, name: str) -> nn.Module | None:
    try:
        found = model.get_submodule(name)
    except AttributeError:
        return None  # a parameter or buffer of the root: no forward of its own
    return found if isinstance(found, nn.Module) else None


def _unit_params(model: nn.Module, name: str) -> int:
    module = _module_of(model, name)
    if module is not None:
        return sum(p.numel() for p in module.parameters())
    owner, _, attr = name.rpartition(".")
    value = getattr(model.get_submodule(owner) if owner else model, attr)
    return value.numel() if isinstance(value, nn.Parameter) else 0


def _tp_params(model: nn.Module, plan: dict[str, str]) -> int:
    """Parameters of the modules the tensor-parallel plan's patterns name."""
    from fnmatch import fnmatch

    return sum(p.numel() for name, module in model.named_modules()
               if any(fnmatch(name, pattern) for pattern in plan)
               for p in module.parameters(recurse=False))
