"""Deferred initialisation: meta build, shard, initialise per shard; same weights anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from tandem.config import PlanConfig
from tandem.parallel import build_strategy
from tandem.parallel.mesh import layout
from tandem.runtime import derive_seed, start, stop
from tests.dist.procs import run_ranks

SEED = 11


class Positional(nn.Module):
    """A module with a parameter of its own, initialised by its own reset_parameters."""

    def __init__(self, n: int, dim: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.empty(n, dim))
        self.register_buffer("scale", torch.arange(dim, dtype=torch.float32) / dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.table[: x.shape[0]] * self.scale


def make_model() -> nn.Module:
    # 13 and 7 rows: uneven shards over 2 ranks.
    return nn.Sequential(nn.Linear(6, 13), nn.LayerNorm(13), Positional(5, 13),
                         nn.Linear(13, 7), nn.Linear(7, 3))


def reference() -> dict[str, torch.Tensor]:
    """The documented procedure, with plain torch: each module, in order, seeded by name."""
    model = make_model()
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            torch.manual_seed(derive_seed("init", SEED, name))
            module.reset_parameters()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _initial_weights(rank: int, world: int, strategy: str, out: str) -> None:
    plan = PlanConfig(strategy=strategy, init="deferred")  # type: ignore[arg-type]
    runtime = start(plan)
    try:
        place = layout(1, runtime.rank, runtime.world_size, runtime.device)
        built = build_strategy(plan, runtime, place, SEED)
        model = built.wrap(make_model)
        assert all(p.device.type == "cpu" for p in model.parameters())
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in full.items()},
                       Path(out) / f"{strategy}-{world}.pt")
    finally:
        stop(runtime)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world", "strategy"), [(1, "single"), (2, "fsdp"), (2, "ddp")])
def test_deferred_weights_equal_the_per_module_reference(tmp_path: Path, world: int,
                                                         strategy: str) -> None:
    run_ranks(_initial_weights, world, strategy, str(tmp_path), timeout=100)
    got = torch.load(tmp_path / f"{strategy}-{world}.pt", weights_only=True)
    want = reference()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    # The buffer kept the constructor's value, not the meta build's emptiness.
    assert torch.equal(got["2.scale"], torch.arange(13, dtype=torch.float32) / 13)


def test_a_parameter_without_reset_parameters_is_named() -> None:
    from tandem.parallel import deferred

    class Bare(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(3))

    model = deferred.build_on_meta(lambda: nn.Sequential(nn.Linear(2, 2), Bare()))
    assert model[0].weight.device.type == "meta"
    with pytest.raises(ValueError, match=r"1\.w"):
        deferred.materialise(model, torch.device("cpu"), SEED)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(6, 12), nn.Linear(12, 6)  # 12 and 6 rows over 2 peers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.proj(torch.relu(self.fc(x)))


class Stacked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def _pipeline_tp_weights(rank: int, world: int, out: str) -> None:
    plan = PlanConfig(pp=2, tp=2, pp_schedule="1F1B", init="deferred")
    runtime = start(plan)
    try:
        place = layout(2, runtime.rank, runtime.world_size, runtime.device, pp=2)
        built = build_strategy(plan, runtime, place, SEED)
        built.wrap(Stacked, {"blocks.*.fc": "colwise", "blocks.*.proj": "rowwise"})
        whole = built.export_model(Stacked)  # every stage's tensor-parallel shards gathered
        if rank == 0:
            torch.save({k: v.detach().clone() for k, v in whole.state_dict().items()},
                       Path(out) / "pp-tp.pt")
    finally:
        stop(runtime)


@pytest.mark.timeout(150)
def test_deferred_weights_under_pipeline_and_tensor_parallel_equal_the_reference(
        tmp_path: Path) -> None:
    # PP2 x TP2: each stage's split layers materialised as shards on meta-built modules.
    run_ranks(_pipeline_tp_weights, 4, str(tmp_path), timeout=130)
    got = torch.load(tmp_path / "pp-tp.pt", weights_only=True)
    model = Stacked()
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            torch.manual_seed(derive_seed("init", SEED, name))
            module.reset_parameters()
    want = model.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(got[key], value), key
