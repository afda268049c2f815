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
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


@dataclass(frozen=True)
class Layout:
    """This rank's place on the (dp, tp) mesh."""

    dp_rank: int
    dp_size: int
    tp_rank: int
    tp_size: int
    mesh: DeviceMesh | None = None  # None when tp_size == 1

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The data-parallel group (None: the whole world)."""
        return None if self.mesh is None else self.mesh.get_group("dp")

    @property
    def tp_mesh(self) -> DeviceMesh | None:
        """The tensor-parallel sub-mesh (None without tensor parallelism)."""
        return None if self.mesh is None else self.mesh["tp"]


def layout(tp: int, rank: int, world_size: int, device: torch.device) -> Layout:
    """The (dp, tp) layout of `world_size` ranks; builds the device mesh when tp > 1."""
    if tp < 1:
        raise ValueError(f"plan.tp: {tp} must be >= 1")
    if world_size % tp:
        raise ValueError(f"plan.tp: {tp} does not divide the {world_size} processes; use a "
                         f"divisor of {world_size} (each data-parallel replica is split over "
                         "plan.tp processes)")
    if tp == 1:
        return Layout(dp_rank=rank, dp_size=world_size, tp_rank=0, tp_size=1)
    mesh = init_device_mesh(device.type, (world_size // tp, tp), mesh_dim_names=("dp", "tp"))
    return Layout(dp_rank=rank // tp, dp_size=world_size // tp, tp_rank=rank % tp,
                  tp_size=tp, mesh=mesh)


def parallelize(model: nn.Module, plan: Mapping[str, str], mesh: DeviceMesh) -> nn.Module:
    """Split the layers that `plan` names over the tensor-parallel `mesh`, in place.

    Every pattern must match at least one nn.Linear (fnmatch on the module path, e.g.
    "blocks.*.attn.q"), and the split dimension must divide by the mesh size.
    """
    size = mesh.size()
    styles = {}
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"Task.tensor_parallel[{pattern!r}]: {style!r} is not a style; "
                             f"use one of {sorted(STYLES)}")
        matched = [(name, module) for name, module in model.named_modules()
                   if fnmatch.fnmatchcase(name, pattern)]
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
            styles[name] = STYLES[style]()
    return parallelize_module(model, mesh, styles)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def mixed_ops() -> contextlib.AbstractContextManager[None]:
    """Let ops mix DTensor and plain (replicated) parameters: the optimizer, the clipping."""
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

