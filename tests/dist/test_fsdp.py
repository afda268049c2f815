"""FSDP2 sharding trains what one plain PyTorch process trains, and stores 1/N per rank."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tandem.data.sampler import epoch_order
from tandem.optim.lamb import LAMB
from tandem.optim.lars import LARS
from tandem.parallel import fsdp
from tandem.runtime import derive_seed
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL, SEED, WORLD = 10, 40, 7, 2

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": toy_task.make_optimizer,
    "lamb": lambda params: LAMB(params, lr=0.02, weight_decay=0.01),
    "lars": lambda params: LARS(params, lr=0.5, weight_decay=1e-3, trust_coefficient=0.02),
}


def reference(optimizer: str) -> dict[str, torch.Tensor]:
    """One process, plain PyTorch, the whole global batch per step."""
    if optimizer == "sgd":
        return toy_task.reference(STEPS, GLOBAL, SEED)[0].state_dict()
    torch.manual_seed(derive_seed("build", SEED))
    data, model = toy_task.IndexedData(), toy_task.make_model()
    opt = OPTIMIZERS[optimizer](model.parameters())
    for ids in toy_task.global_batches(STEPS, GLOBAL, SEED):
        opt.zero_grad()
        nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
        opt.step()
    return model.state_dict()


CASES = {"sgd": ("sgd", 1), "sgd_accum": ("sgd", 2), "lamb": ("lamb", 1), "lars": ("lars", 1)}


def _train(model: nn.Module, optimizer: str, accum: int, rank: int, world: int) -> None:
    data = toy_task.IndexedData()
    opt = OPTIMIZERS[optimizer](model.parameters())
    share = GLOBAL // world
    for ids in toy_task.global_batches(STEPS, GLOBAL, SEED):
        mine = ids[rank * share:(rank + 1) * share]
        for k, micro in enumerate(mine.chunk(accum)):
            last = k == accum - 1
            with contextlib.nullcontext() if last else fsdp.no_sync(model):
                loss = nn.functional.mse_loss(model(data.x[micro]), data.y[micro]) / accum
                loss.backward()
        opt.step()
        opt.zero_grad()


def _local_param_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameters this rank stores (its shards, not the gathered tensors)."""
    return sum(p.to_local().numel() * p.element_size() for p in model.parameters())


def _case(rank: int, world: int, optimizer: str, accum: int) -> dict:
    torch.manual_seed(derive_seed("build", SEED))
    model = toy_task.make_model()
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    model = fsdp.shard(model, reshard_after_forward=True, param_dtype=None, reduce_dtype=None)
    local = _local_param_bytes(model)
    _train(model, optimizer, accum, rank, world)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    total = torch.tensor([local])
    dist.all_reduce(total)
    plain = fsdp.gather(model, toy_task.make_model())
    return {"state": {k: v.detach().clone() for k, v in state.items()},
            "gathered": plain.state_dict(), "local": local, "total": int(total),
            "full": full_bytes}


def _worker(rank: int, world: int, out: str) -> None:
    """Every case in one process group: starting processes costs far more than training."""
    dist.init_process_group("gloo")
    results = {case: _case(rank, world, *args) for case, args in CASES.items()}
    if rank == 0:
        torch.save(results, Path(out, "results.pt"))
    # An FSDP2 module that ran holds its process group; freed only at interpreter exit,
    # after destroy_process_group, gloo sometimes aborts the process ("terminate called
    # without an active exception", ~1 run in 10). Free the modules (cycles) first.
    gc.collect()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(_worker, WORLD, str(out), timeout=110)
    return torch.load(out / "results.pt", weights_only=True)


def _check(got: dict, optimizer: str) -> None:
    want = reference(optimizer)
    assert sorted(got["state"]) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got["state"][name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(120)
def test_fsdp_sgd_matches_plain_pytorch(results: dict) -> None:
    _check(results["sgd"], "sgd")


@pytest.mark.timeout(120)
def test_gather_gives_a_plain_module_with_the_full_weights(results: dict) -> None:
    got = results["sgd"]
    for name, value in got["state"].items():
        assert type(got["gathered"][name]) is torch.Tensor
        torch.testing.assert_close(got["gathered"][name], value, rtol=0, atol=0, msg=name)


@pytest.mark.timeout(120)
def test_each_rank_stores_about_one_nth_of_the_parameters(results: dict) -> None:
    got = results["sgd"]
    # Every byte is stored once over the ranks, and each rank holds about 1/N of them
    # (the uneven split of a 3-row layer over 2 ranks puts rank 0 a few % above half).
    assert got["total"] == got["full"]
    assert abs(got["local"] - got["full"] / WORLD) <= 0.1 * got["full"] / WORLD


@pytest.mark.timeout(120)
def test_fsdp_gradient_accumulation_matches_plain_pytorch(results: dict) -> None:
    _check(results["sgd_accum"], "sgd")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("optimizer", ["lamb", "lars"])
def test_layerwise_optimizers_work_on_sharded_parameters(results: dict, optimizer: str) -> None:
    # The trust ratios need whole-layer norms: on DTensor shards they must be reduced
    # over the ranks, or each rank would scale its shard by a different ratio.
    _check(results[optimizer], optimizer)


def test_auto_blocks_are_the_children_of_the_outermost_containers() -> None:
    inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, 4)
            self.layers = nn.ModuleList([inner, nn.Linear(4, 4)])
            self.head = nn.Sequential(nn.Linear(4, 2))  # one child: not a stack of blocks

    net = Net()
    assert fsdp.find_blocks(net) == [inner, net.layers[1]]
    assert fsdp.find_blocks(net, (nn.Linear,)) == [
        net.embed, inner[0], inner[2], net.layers[1], net.head[0]]
    toy = toy_task.make_model()
    assert fsdp.find_blocks(toy) == [toy[0], toy[2]]  # the Tanh owns no parameters
