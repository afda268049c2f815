"""What a model costs, measured on the meta device (no memory, no real compute): per unit
(the parts a pipeline cuts along: before the blocks, each block, after them), its
parameters, the FLOPs of its forward and the bytes autograd saves for its backward, for
one sample.

The forward runs on meta tensors of a real first micro-batch's shapes: the saved bytes are
what autograd keeps (parameters, which it saves by reference, excluded), the FLOPs those
torch's counter sees (matmuls, convolutions). A backward costs two forwards.

Under tensor parallelism only some of the saved bytes split over the peers: those the
task's column-parallel layers produce and what is computed from them up to a row-parallel
layer's output (the attention's q, k, v and output, the MLP's hidden layer); a layer's
replicated input, the norms, the residual stream and the loss stay whole on every peer.
The profile follows that split through the forward (`tp_saved_bytes`).

`F.scaled_dot_product_attention` is counted as a fused (flash) kernel runs it: it keeps
its inputs, its output and one float per query and head, never the probabilities (on the
meta device torch would take the unfused path, which keeps them: s^2 per head).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
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
    tp_saved_bytes: float = 0.0  # of saved_bytes, those tensor parallelism splits
    largest_bytes: float = 0.0  # the largest saved tensor tensor parallelism keeps whole
    tp_largest_bytes: float = 0.0  # and the largest it splits, per sample (fp32)


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


class _Split(TorchFunctionMode):
    """Marks the tensors tensor parallelism would split: a column-parallel layer's output
    and whatever an op computes from a marked tensor (a row-parallel layer's output is
    unmarked again: its all-reduce makes it whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.marked: dict[int, torch.Tensor] = {}  # by id; held, so ids are not reused

    def mark(self, value: Any, split: bool = True) -> None:
        for t in tree_leaves(value):
            if isinstance(t, torch.Tensor):
                if split:
                    self.marked[id(t)] = t
                else:
                    self.marked.pop(id(t), None)

    def split(self, t: torch.Tensor) -> bool:
        return id(t) in self.marked or (t._base is not None and id(t._base) in self.marked)

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and self.split(t)
               for t in tree_leaves((args, kwargs or {}))):
            self.mark(out)
        return out


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
    tp_saved = dict.fromkeys(order, 0.0)
    largest = {n: [0.0, 0.0] for n in order}  # [whole, split]
    split = _Split()
    boundary: list[float] = []
    counter = FlopCounterMode(display=False)
    current: list[str] = []
    last = [order[0]] if order else [""]  # where saved tensors outside any unit go
    seen: dict[int, torch.Tensor] = {}  # saved storages by their base's id (held)
    kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # (unit, tensor, its base)

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
        # A saved view keeps its base's storage: each storage counts once, whole.
        base = t._base if t._base is not None else t
        if id(base) not in seen and id(base) not in owned:
            seen[id(base)] = base
            # Outside every unit (the root's own ops, the loss): the unit that ran last.
            kept.append((current[-1] if current else last[0], t, base))
        return t

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any,
                  **kwargs: Any) -> torch.Tensor:
        # Laid out as the fused kernels return it ([batch, query, head, dim] in memory),
        # so that merging the heads afterwards is a view, not a copy.
        shape = (*q.shape[:-1], v.shape[-1])
        out = (torch.empty(*shape[:-3], shape[-2], shape[-3], shape[-1], device=q.device,
                           dtype=q.dtype, requires_grad=True).transpose(-3, -2)
               if q.dim() >= 3 else torch.empty(*shape, device=q.device, dtype=q.dtype,
                                                requires_grad=True))
        for t in (q, k, v, out):  # kept by the kernel: not counted again when others keep them
            base = t._base if t._base is not None else t
            seen[id(base)] = base
        where = current[-1] if current else last[0]
        kept = (q.numel() + k.numel() + v.numel() + out.numel() + q.numel() // q.shape[-1])
        saved[where] += kept * 4.0
        if split.split(q):  # the heads split over the peers: all of it with them
            tp_saved[where] += kept * 4.0
            split.mark(out)
        score_macs = q.numel() * k.shape[-2] + out.numel() * k.shape[-2]
        flops[where] += 2.0 * score_macs  # QK^T and PV (no causal saving, as torch counts)
        return out

    handles = []
    for name, module in _tp_modules(model, tensor_parallel or {}):
        colwise = tensor_parallel[name_pattern(name, tensor_parallel)] != "rowwise"
        handles.append(module.register_forward_hook(
            lambda _m, _a, out, colwise=colwise: split.mark(out, colwise)))
    for name in order:
        module = _module_of(model, name)
        if module is not None:
            handles += [module.register_forward_pre_hook(enter(name)),
                        module.register_forward_hook(leave(name))]
    fused = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = attention
    try:
        with _FlopCounterMode(counter), torch.autograd.graph.saved_tensors_hooks(
                pack, lambda t: t), split if tensor_parallel else contextlib.nullcontext():
            forward(model, _to_meta(batch))
    finally:
        torch.nn.functional.scaled_dot_product_attention = fused
        for h in handles:
            h.remove()
    # Split or whole is known once the forward is done (an op's output is marked after
    # the op, which may have saved it already).
    for where, t, base in kept:
        size, cut = base.numel() * 4.0, split.split(t)  # as fp32
        saved[where] += size
        tp_saved[where] += size if cut else 0.0
        largest[where][cut] = max(largest[where][cut], size)
    per = 1.0 / samples
    out = tuple(Unit(n, params[n], flops[n] * per, saved[n] * per, n in blocks,
                     tp_saved[n] * per, largest[n][0] * per, largest[n][1] * per)
                for n in order)
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


def name_pattern(name: str, plan: dict[str, str]) -> str:
    """The tensor-parallel plan's pattern that names module `name` ("" : none)."""
    return next((pattern for pattern in plan if fnmatch(name, pattern)), "")


def _tp_modules(model: nn.Module, plan: dict[str, str]) -> list[tuple[str, nn.Module]]:
    """The modules the tensor-parallel plan's patterns name."""
    return [(name, m) for name, m in model.named_modules() if name_pattern(name, plan)]


def _tp_params(model: nn.Module, plan: dict[str, str]) -> int:
    """Parameters of the modules the tensor-parallel plan's patterns name."""
    return sum(p.numel() for _, module in _tp_modules(model, plan)
               for p in module.parameters(recurse=False))
