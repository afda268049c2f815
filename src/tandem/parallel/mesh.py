"""This rank's place on the N-dimensional mesh of the world.

The mesh's axes, outermost first, are pipeline stages (`pp`), data-parallel replicas
(`dp_replicate`: each holds whole weights, DDP), data-parallel shards (`dp_shard`: the
weights split over them, FSDP) and tensor-parallel peers (`tp`). A rank's data-parallel
index counts over both data axes: the data it reads depends on it only. Pipeline
stages combine with data-parallel replicas or shards and with tensor parallelism (a
(pp, dp) or (pp, dp, tp) mesh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

AXES = ("pp", "dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class Layout:
    """This rank's place on the (pp, dp_replicate, dp_shard, tp) mesh."""

    sizes: tuple[int, int, int, int]  # processes along each of AXES
    coords: tuple[int, int, int, int]  # this rank's index along each of AXES
    mesh: DeviceMesh | None = None  # (dp, tp), (pp, dp) or (pp, dp, tp); None when pp = tp = 1

    def size(self, axis: str) -> int:
        """Processes along `axis` (one of AXES)."""
        return self.sizes[AXES.index(axis)]

    def index(self, axis: str) -> int:
        """This rank's index along `axis` (one of AXES)."""
        return self.coords[AXES.index(axis)]

    @property
    def dp_size(self) -> int:
        """Data-parallel processes: replicas x shards."""
        return self.size("dp_replicate") * self.size("dp_shard")

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index (which part of each global batch it reads)."""
        return self.index("dp_replicate") * self.size("dp_shard") + self.index("dp_shard")

    @property
    def tp_size(self) -> int:
        """Tensor-parallel peers of one replica."""
        return self.size("tp")

    @property
    def tp_rank(self) -> int:
        """This rank's index among its tensor-parallel peers."""
        return self.index("tp")

    @property
    def dp_group(self) -> dist.ProcessGroup | None:
        """The data-parallel group (None: the whole world)."""
        return None if self.mesh is None else self.mesh.get_group("dp")

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        """The ranks of this rank's pipeline (None without pipeline stages)."""
        return None if self.size("pp") == 1 or self.mesh is None else self.mesh.get_group("pp")

    @property
    def tp_mesh(self) -> DeviceMesh | None:
        """The tensor-parallel sub-mesh (None without tensor parallelism)."""
        return None if self.mesh is None or self.size("tp") == 1 else self.mesh["tp"]


def coords_of(rank: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
    """A rank's index along each axis, the last axis varying fastest."""
    out = []
    for size in reversed(sizes):
        out.append(rank % size)
        rank //= size
    return tuple(reversed(out))


def layout(tp: int, rank: int, world_size: int, device: torch.device,
           shard: bool = False, pp: int = 1) -> Layout:
    """The layout of `world_size` ranks in `pp` pipeline stages of `tp` tensor-parallel
    peers each; the data-parallel processes are shards of the weights (`shard`, FSDP) or
    replicas (of each stage, under a pipeline). Builds the device mesh when tp > 1 or
    pp > 1."""
    if tp < 1:
        raise ValueError(f"plan.tp: {tp} must be >= 1")
    if pp > 1:
        if world_size % (pp * tp):
            raise ValueError(f"plan.pp x plan.tp: {pp} x {tp} does not divide the {world_size} "
                             f"processes; use stages x tensor-parallel peers dividing "
                             f"{world_size}")
        dp = world_size // (pp * tp)
        # (pp, dp) or (pp, dp, tp): every sub-group made by the mesh, on every rank, in one
        # order, as NCCL needs.
        shape, names = ((pp, dp, tp), ("pp", "dp", "tp")) if tp > 1 else ((pp, dp), ("pp", "dp"))
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=names)
        sizes = (pp, 1, dp, tp) if shard else (pp, dp, 1, tp)
        return Layout(sizes=sizes, coords=coords_of(rank, sizes), mesh=mesh)
    if world_size % tp:
        raise ValueError(f"plan.tp: {tp} does not divide the {world_size} processes; use a "
                         f"divisor of {world_size} (each data-parallel replica is split over "
                         "plan.tp processes)")
    dp = world_size // tp
    sizes = (1, 1, dp, tp) if shard else (1, dp, 1, tp)
    assert math.prod(sizes) == world_size
    coords = coords_of(rank, sizes)
    mesh = (None if tp == 1 else
            init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp")))
    return Layout(sizes=sizes, coords=coords, mesh=mesh)  # type: ignore[arg-type]
