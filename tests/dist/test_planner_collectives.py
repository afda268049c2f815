"""The planner counts the collectives a step really runs: FSDP2's gathers and
reduce-scatters, tensor parallelism's all-reduces (each costs the machine's fixed
`collective_s` in the step-time model), counted here on a real 2-process step."""

from __future__ import annotations

import gc
from collections import Counter

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tandem.parallel.fsdp import bytes_per_step
from tandem.planner.layouts import fsdp_collectives, tp_collectives
from tests.dist.procs import run_ranks

BLOCKS, MICRO_BATCHES, DIM = 3, 2, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a_in, self.a_out = nn.Linear(DIM, DIM), nn.Linear(DIM, DIM)
        self.m_in, self.m_out = nn.Linear(DIM, 2 * DIM), nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.a_out(torch.tanh(self.a_in(x)))
        return x + self.m_out(torch.relu(self.m_in(x)))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = nn.Linear(DIM, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Collectives(TorchDispatchMode):
    """Counts the collectives dispatched (c10d's and the functional ones DTensor uses; not
    the waits and autograd wrappers that come with the functional ones)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[str] = Counter()
        self.gathered = 0  # bytes of the all-gathers' outputs
        self.scattered = 0  # bytes of the reduce-scatters' inputs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func.namespace in ("c10d", "_c10d_functional") and not func.__name__.startswith(
                ("wait_tensor", "_wrap_tensor_autograd")):
            self.seen[func.__name__] += 1
            if func.__name__.startswith("_allgather_base_"):
                self.gathered += args[0].numel() * args[0].element_size()
            elif func.__name__.startswith("_reduce_scatter_base_"):
                self.scattered += args[1].numel() * args[1].element_size()
        return func(*args, **(kwargs or {}))


def _step(model: nn.Module, last_sync: object) -> None:
    for i in range(MICRO_BATCHES):
        last_sync(i == MICRO_BATCHES - 1)
        model(torch.randn(8, 4)).square().mean().backward()


def _fsdp_step() -> dict[str, int]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    _step(model, model.set_requires_gradient_sync)  # lazy init, first gathers
    with Collectives() as counted:
        _step(model, model.set_requires_gradient_sync)
    world = dist.get_world_size()
    sent = (world - 1) / world * (counted.gathered + counted.scattered)
    return {**counted.seen, "sent": sent,
            "formula": bytes_per_step(model, world, MICRO_BATCHES, True, None, None)}


def _tp_step() -> dict[str, int]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = Model()
    for block in model.blocks:
        parallelize_module(block, mesh, {"a_in": ColwiseParallel(), "a_out": RowwiseParallel(),
                                         "m_in": ColwiseParallel(), "m_out": RowwiseParallel()})
    with Collectives() as counted:
        _step(model, lambda last: None)
    return dict(counted.seen)


def _count(rank: int, world: int, step: object, out: object) -> None:
    dist.init_process_group("gloo")
    seen = step()  # its model gone with its frame
    if rank == 0:
        out.put(seen)
    # As `tandem.runtime.stop`: FSDP2 and DTensor modules hold the group in reference
    # cycles, and gloo can abort a process whose group outlives destroy_process_group.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _counted(step: object) -> dict[str, int]:
    import multiprocessing as mp

    with mp.get_context("spawn").Manager() as manager:
        out = manager.Queue()
        run_ranks(_count, 2, step, out, timeout=90)
        return out.get(timeout=5)


def test_fsdp_step_runs_the_collectives_the_planner_prices() -> None:
    seen = _counted(_fsdp_step)
    sent, formula = seen.pop("sent"), seen.pop("formula")
    # A unit per block, and the root holding the embedding and the head.
    assert sum(seen.values()) == fsdp_collectives(BLOCKS, True, MICRO_BATCHES), seen
    # What the collectives moved (every size here splits evenly over 2 ranks: no padding)
    # is what tandem reports as FSDP's bytes per step.
    assert formula == sent


def test_tensor_parallel_step_runs_the_all_reduces_the_planner_prices() -> None:
    seen = _counted(_tp_step)
    assert sum(seen.values()) == tp_collectives(BLOCKS, MICRO_BATCHES), seen
