"""This rank's place on the (data-parallel x tensor-parallel) mesh of the world."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


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
