"""Where a pipeline of FSDP2 shards keeps its parameters, counted from the model's shapes.

Each process holds one plain copy of the whole model (run for the preflight check,
evaluation and the exported module) plus its stage's FSDP2 shards; the model whose names
key the checkpoints keeps the other processes' stages on the meta device, its tied head
weight still the embedding's. The count is made from a fresh model's parameter shapes and
the explicit split, not from the strategy's own bookkeeping.
"""

from __future__ import annotations

import math
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from tandem.config import PlanConfig
from tandem.parallel import build_strategy
from tandem.parallel.mesh import layout
from tandem.runtime import Runtime, start, stop
from tests.dist.procs import run_ranks

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import char_lm  # noqa: E402

BUILD = partial(char_lm.CharLM, dim=16, layers=2, heads=2)
SPLITS = {2: "embed,pos,blocks.0|blocks.1,norm,head",
          4: "embed,pos|blocks.0|blocks.1|norm,head"}


def _held_bytes(modules: list[nn.Module]) -> int:
    """Bytes of the distinct storages behind every real (not meta) parameter and buffer
    of `modules` (a sharded parameter's local shard)."""
    from torch.distributed.tensor import DTensor

    seen: dict[int, int] = {}
    for module in modules:
        for _, t in [*module.named_parameters(remove_duplicate=False),
                     *module.named_buffers(remove_duplicate=False)]:
            t = t.to_local() if isinstance(t, DTensor) else t
            if t.device.type != "meta":
                storage = t.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _expected_bytes(pp: int, pp_rank: int, dp: int) -> tuple[int, set[str]]:
    """One whole model plus, for this stage's parameters, FSDP2's shard of dim 0 (padded
    to ceil(rows / dp) rows on every rank); and the names this stage holds."""
    fresh = BUILD()
    whole = sum(p.numel() * p.element_size() for p in fresh.parameters())
    whole += sum(b.numel() * b.element_size() for b in fresh.buffers())
    units = SPLITS[pp].split("|")[pp_rank].split(",")
    held = {n: p for n, p in fresh.named_parameters(remove_duplicate=False)
            if any(n == u or n.startswith(u + ".") for u in units)}
    unique = {id(p): p for p in held.values()}.values()  # the tied weight once
    shards = sum(math.ceil(p.shape[0] / dp) * math.prod(p.shape[1:]) * p.element_size()
                 for p in unique)
    return whole + shards, set(held)


def _placement(rank: int, world: int) -> None:
    plan = PlanConfig(strategy="fsdp")
    runtime = start(plan)
    try:
        for pp in SPLITS:
            _check(rank, world, pp, runtime)
    finally:
        stop(runtime)


def _check(rank: int, world: int, pp: int, runtime: Runtime) -> None:
    from torch.distributed.tensor import DTensor

    plan = PlanConfig(strategy="fsdp", pp=pp, pp_schedule="1F1B", pp_split=SPLITS[pp])
    place = layout(1, rank, world, runtime.device, shard=True, pp=pp)
    strategy = build_strategy(plan, runtime, place, 0)
    strategy.wrap(BUILD)
    dp, pp_rank = world // pp, rank // (world // pp)
    want, mine = _expected_bytes(pp, pp_rank, dp)
    held = _held_bytes([strategy.model, strategy.naming_module(), strategy.full,
                        *strategy.parts])
    assert held == want, (pp, rank, held, want)
    named = strategy.naming_module()
    ends = {"embed.weight", "head.weight"}
    for name, p in named.named_parameters(remove_duplicate=False):
        if name in mine or (name in ends and mine & ends):  # a tie: under both names
            assert isinstance(p, DTensor), (pp, rank, name)
        else:
            assert p.device.type == "meta", (pp, rank, name, p.device)
    assert named.head.weight is named.embed.weight
    # The tie's gradient is summed over the stages holding it; a stage holding neither
    # end (PP4's middle ones) sends zeros of its shard's shape, made on its device.
    strategy.after_backward()
    if "head.weight" in mine:
        assert torch.count_nonzero(named.head.weight.grad.to_local()) == 0


@pytest.mark.timeout(150)
def test_pipeline_shards_hold_one_whole_model_and_their_stage(tmp_path: Path) -> None:
    # PP2 x FSDP2: the tie's ends on two processes; PP4 x FSDP1: two middle stages hold
    # neither end of it.
    run_ranks(_placement, 4, timeout=140)
