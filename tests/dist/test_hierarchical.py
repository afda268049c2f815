"""Hierarchical all-reduce (2 simulated nodes x 2 ranks) trains what flat DDP trains."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.parallel.hierarchical import register_hierarchical, topology
from tests.dist import toy_task
from tests.dist.procs import run_ranks
from tests.dist.test_hooks import GLOBAL, SEED, train_ddp

STEPS, WORLD, LOCAL = 5, 4, 2


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _worker(rank: int, world: int, out: str) -> None:
    # procs.run_ranks puts every rank on one "node"; pretend there are two.
    os.environ["LOCAL_WORLD_SIZE"] = str(LOCAL)
    dist.init_process_group("gloo")
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    flat, _ = train_ddp(toy_task.make_model, STEPS, rank, world)
    tiered, _ = train_ddp(toy_task.make_model, STEPS, rank, world,
                          lambda ddp: register_hierarchical(ddp, local_world_size))
    grads = {name: p.grad.detach().clone() for name, p in tiered.module.named_parameters()}
    flat_grads = {name: p.grad.detach().clone() for name, p in flat.module.named_parameters()}
    torch.save({"flat": _state(flat.module), "tiered": _state(tiered.module), "grads": grads,
                "flat_grads": flat_grads}, Path(out, f"rank{rank}.pt"))
    del flat, tiered
    gc.collect()  # free the DDP modules and hook state while the groups still exist
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_hierarchical_all_reduce_matches_flat_ddp_on_every_rank(tmp_path: Path) -> None:
    run_ranks(_worker, WORLD, str(tmp_path), timeout=110)
    ref, _ = toy_task.reference(STEPS, GLOBAL, SEED)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        for name, value in got["flat_grads"].items():
            torch.testing.assert_close(got["grads"][name], value, rtol=1e-5, atol=1e-7,
                                       msg=f"rank {rank} grad {name}")
        for name, value in got["flat"].items():
            torch.testing.assert_close(got["tiered"][name], value, rtol=1e-5, atol=1e-6,
                                       msg=f"rank {rank} {name}")
            # and both equal one plain PyTorch process (an independent computation)
            torch.testing.assert_close(got["tiered"][name], ref.state_dict()[name],
                                       rtol=1e-5, atol=1e-6, msg=f"rank {rank} {name} vs ref")


def test_topology_numbers_nodes_like_torchrun() -> None:
    assert topology(4, 2) == ([[0, 1], [2, 3]], [0, 2])
    assert topology(6, 3) == ([[0, 1, 2], [3, 4, 5]], [0, 3])
    assert topology(2, 1) == ([[0], [1]], [0, 1])
    with pytest.raises(ValueError, match="local_world_size: 3"):
        topology(4, 3)
