"""Hierarchical gradient all-reduce for multi-node jobs, as a DDP communication hook.

A flat ring over all ranks crosses the (slow) network between nodes 2 (N - 1) / N times
per byte for every rank. Reducing inside each node first (fast NVLink / shared memory),
all-reducing only among one leader per node, and broadcasting back inside each node
sends each byte over the network from one process per node instead of all of them.
"""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with the real `dist.GradBucket` and `Future[Tensor]` types, and string
# annotations fail that check.

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

log = logging.getLogger("tandem")


@dataclass(frozen=True)
class HierarchicalState:
    """This rank's place in the two-level topology (the hook's `state`)."""

    world: int
    local_world_size: int
    nodes: int
    leader: int  # global rank of this node's leader (its local rank 0)
    node_group: dist.ProcessGroup
    leader_group: dist.ProcessGroup | None  # None on ranks that lead no node

    @property
    def is_leader(self) -> bool:
        """True on the rank that speaks for its node between nodes."""
        return self.leader_group is not None


def topology(world: int, local_world_size: int) -> tuple[list[list[int]], list[int]]:
    """(ranks of each node, leader of each node), for ranks numbered node by node.

    torchrun numbers ranks this way: node n holds ranks n * local_world_size onwards.
    """
    if local_world_size < 1 or world % local_world_size:
        raise ValueError(
            f"local_world_size: {local_world_size!r} does not divide the world size {world}; "
            "expected the number of processes per node, equal on every node"
        )
    nodes = [list(range(n, n + local_world_size)) for n in range(0, world, local_world_size)]
    return nodes, [ranks[0] for ranks in nodes]


def _done(value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(value)
    return fut


def hierarchical_hook(state: HierarchicalState,
                      bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all ranks: reduce in node, all-reduce leaders, broadcast.

    Each phase needs the previous one's result. `wait()` orders them: on NCCL it only
    makes the current CUDA stream wait (the CPU runs on); on gloo it blocks this
    backward thread for the first two phases, and only the broadcast overlaps compute.
    """
    buffer = bucket.buffer().div_(state.world)
    if state.local_world_size > 1:
        dist.reduce(buffer, dst=state.leader, group=state.node_group, async_op=True).wait()
    if state.is_leader and state.nodes > 1:
        dist.all_reduce(buffer, group=state.leader_group, async_op=True).wait()
    if state.local_world_size == 1:
        return _done(buffer)
    work = dist.broadcast(buffer, src=state.leader, group=state.node_group, async_op=True)

    def averaged(fut: torch.futures.Future) -> torch.Tensor:
        fut.value()  # re-raises a failed broadcast
        return buffer

    return work.get_future().then(averaged)


def register_hierarchical(ddp: DistributedDataParallel, local_world_size: int) -> None:
    """Make `ddp` average gradients node by node (see `hierarchical_hook`).

    Creates one process group per node and one among the node leaders. Must be called
    on all processes, in the same order relative to other group creations, before the
    first forward; DDP must span the whole world (ranks numbered node by node).
    """
    world = dist.get_world_size()
    if dist.get_world_size(ddp.process_group) != world:
        raise ValueError(
            f"hierarchical all-reduce: DDP spans {dist.get_world_size(ddp.process_group)} "
            f"of {world} ranks; it needs a DDP over the whole world"
        )
    nodes, leaders = topology(world, local_world_size)
    rank = dist.get_rank()
    node_group, _ = dist.new_subgroups_by_enumeration(nodes)
    leader_group = dist.new_group(leaders)  # every rank must call new_group
    state = HierarchicalState(
        world=world, local_world_size=local_world_size, nodes=len(nodes),
        leader=leaders[rank // local_world_size], node_group=node_group,
        leader_group=leader_group if rank in leaders else None)
    ddp.register_comm_hook(state, hierarchical_hook)
    log.info("hierarchical all-reduce: %d nodes x %d ranks", len(nodes), local_world_size)
