"""Data x tensor parallelism on a 2-D device mesh (DTensor).

The world is laid out as a (dp, tp) mesh: ranks r*tp .. r*tp+tp-1 form tensor-parallel
group r and hold one replica of the model between them; ranks with the same position in
their tensor-parallel groups form a data-parallel group. The task names the layers to
split (`Task.tensor_parallel`: module path pattern -> "colwise" | "rowwise", Megatron
style: a column-wise layer keeps its output sharded, the row-wise layer after it takes
the shard and all-reduces its output). Parameters the plan does not name stay ordinary
tensors, replicated inside the tensor-parallel group.

Gradients are averaged over the data-parallel group after the last backward of a step,
in one flat all-reduce per dtype (`GradientSync`); each rank sends its own local shard,
so the traffic per rank is 1/tp of a data-parallel replica's. That all-reduce is what
`comm/bytes_per_step` counts; the activation all-reduces inside the tensor-parallel
group (two per split block in forward, two in backward) are not counted. The gradient
all-reduce runs after backward, not overlapped with it.

DTensor is imported by the functions that use it, not with this module: its import is a
large part of start-up, which plans without tensor parallelism should not pay.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from tandem.monitor.catalogue import COMM_BYTES_PER_STEP
from tandem.parallel.fsdp import gather
from tandem.parallel.mesh import Layout, layout  # noqa: F401 - re-exported
from tandem.parallel.registry import TP, StrategyInfo
from tandem.parallel.strategy import Build, Strategy

STYLES = ("colwise", "rowwise")  # ColwiseParallel, RowwiseParallel


def parallelize(model: nn.Module, plan: Mapping[str, str], mesh: DeviceMesh) -> nn.Module:
    """Split the layers that `plan` names over the tensor-parallel `mesh`, in place.

    Every pattern must match at least one nn.Linear (fnmatch on the module path, e.g.
    "blocks.*.attn.q"), and the split dimension must divide by the mesh size.
    """
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from tandem.finetune import lora_tp

    size = mesh.size()
    adapted = lora_tp.styles()  # a layer with LoRA adapters splits them with it
    styles = {}
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"Task.tensor_parallel[{pattern!r}]: {style!r} is not a style; "
                             f"use one of {sorted(STYLES)}")
        matched = [(name, module) for name, module in model.named_modules()
                   if fnmatch.fnmatchcase(name, pattern) and not lora_tp.is_adapter(name)]
        if not matched:
            raise ValueError(f"Task.tensor_parallel: {pattern!r} matches no module of "
                             f"{type(model).__name__}")
        for name, module in matched:
            if not isinstance(module, nn.Linear):
                raise ValueError(f"Task.tensor_parallel: {name} is a {type(module).__name__}; "
                                 "only nn.Linear layers can be split")
            dim = module.out_features if style == "colwise" else module.in_features
            if dim % size:
                raise ValueError(f"Task.tensor_parallel: {name} has {dim} "
                                 f"{'output' if style == 'colwise' else 'input'} features, "
                                 f"which plan.tp={size} does not divide")
            if lora_tp.is_adapted(module):
                styles[name] = adapted[style]()
            else:
                styles[name] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    return parallelize_module(model, mesh, styles)


def split_layers(model: nn.Module, tensor_plan: Mapping[str, str] | None,
                 place: Layout) -> nn.Module:
    """`parallelize` the task's named layers over `place`'s tensor-parallel sub-mesh."""
    if place.tp_mesh is None:
        raise ValueError("plan.tp > 1 needs a layout of the ranks with a tp axis")
    if not tensor_plan:
        raise ValueError(f"plan.tp: {place.tp_size} needs the task to name the layers to "
                         "split (Task.tensor_parallel = {'blocks.*.mlp.fc': 'colwise', "
                         "...})")
    return parallelize(model, tensor_plan, place.tp_mesh)


def tp_sharded(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is split over the tensor-parallel peers (else each holds all of
    it, or a data-parallel shard of all of it)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return False
    names = tensor.device_mesh.mesh_dim_names or ()
    return "tp" in names and tensor.placements[names.index("tp")].is_shard()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def mixed_ops() -> contextlib.AbstractContextManager[None]:
    """Let ops mix DTensor and plain (replicated) parameters: the optimizer, the clipping."""
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


class GradientSync:
    """Average the gradients over the data-parallel group: one flat all-reduce per dtype."""

    def __init__(self, params: list[nn.Parameter], group: dist.ProcessGroup | None,
                 size: int) -> None:
        self.params = params
        self.group = group
        self.size = size
        self.bytes_sent = 0  # since the last take_bytes()
        self.steps = 0

    def __call__(self) -> None:
        if self.size == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self.params:
            if p.grad is not None:
                grad = local(p.grad)
                by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            flat.div_(self.size)
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            self.bytes_sent += flat.numel() * flat.element_size()
        self.steps += 1

    def bytes_per_step(self) -> float:
        """Payload bytes each rank put into the all-reduce per step, since the last call."""
        value = self.bytes_sent / self.steps if self.steps else 0.0
        self.bytes_sent, self.steps = 0, 0
        return value



class TensorParallelStrategy(Strategy):
    """Data x tensor parallel: the task's named layers split inside each group of `tp`
    ranks, gradients averaged over the data-parallel group after backward."""

    info: ClassVar[StrategyInfo] = TP
    wraps_meta: ClassVar[bool] = True

    sync: GradientSync | None = None

    def _split(self, model: nn.Module, tensor_plan: Mapping[str, str] | None) -> nn.Module:
        return split_layers(model, tensor_plan, self.layout)

    def _wrap(self, model: nn.Module) -> nn.Module:
        params = [p for p in model.parameters() if p.requires_grad]
        self.sync = GradientSync(params, self.layout.dp_group, self.layout.dp_size)
        return model

    def after_backward(self) -> None:
        """Average the gradients over the data-parallel group (one flat all-reduce)."""
        assert self.sync is not None, "wrap() first"
        self.sync()

    def optimizer_context(self) -> contextlib.AbstractContextManager[None]:
        """DTensor and plain (replicated) parameters meet in one optimizer and one norm."""
        return mixed_ops()

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float]:
        """The data-parallel all-reduce's bytes per step (see the module docstring)."""
        if self.sync is None or not self.sync.steps:
            return {}
        return {COMM_BYTES_PER_STEP: self.sync.bytes_per_step()}

    def export_model(self, build: Build) -> nn.Module:
        """The full weights gathered into a fresh plain module."""
        assert self.model is not None, "wrap() first"
        return gather(self.model, build().to(self.runtime.device))

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        return {"strategy": self.name, "tp": self.layout.tp_size}
