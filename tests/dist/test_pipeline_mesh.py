"""Pipelines on a device mesh with FSDP2 shards or tensor-parallel peers, in four processes.

Where a pipeline of FSDP2 shards keeps its parameters, counted from the model's shapes:
each process holds one plain copy of the whole model (run for the preflight check,
evaluation and the exported module) plus its stage's shards; the model whose names key the
checkpoints keeps the other processes' stages on the meta device, its tied head weight
still the embedding's. Then the char-LM transformer as two stages of two tensor-parallel
peers (PP2 x TP2, ZBVZeroBubble: two stages a process, V-shaped, the backward split in
input and weight passes) trains what one plain PyTorch process trains, and its checkpoint
resumes as four stages (PP4), four DDP replicas (DP4) and one process: the next step's
loss and the final weights are the one process's, and every sample of the resumed steps
is trained once. (PP2 x FSDP2 x TP2 needs eight processes: benchmarks/pipeline_mesh.py.)
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

import tandem
from tandem.config import PlanConfig
from tandem.data.sampler import epoch_order
from tandem.parallel import build_strategy
from tandem.parallel.mesh import layout
from tandem.runtime import Runtime, start, stop
from tests.dist.procs import run_ranks
from tests.dist.test_pipeline import (
    GLOBAL,
    MICRO,
    SEED,
    STEPS,
    N,
    T,
    argv,
    assert_weights,
    reference,
)
from tests.dist.token_data import Tokens, adamw

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import char_lm  # noqa: E402

BUILD = partial(char_lm.CharLM, dim=16, layers=2, heads=2)
SPLITS = {2: "embed,pos,blocks.0|blocks.1,norm,head",
          4: "embed,pos|blocks.0|blocks.1|norm,head"}
SEEN: list[tuple[list[int], float]] = []  # (sample ids, loss) of each training micro-batch
HALF = STEPS // 2
# The resumed legs: (run name, world size, argv after the common ones, ranks whose losses
# cover each global batch once: the last stage's first tensor-parallel peer).
LEGS = [("pp4", ["--plan.pp", "4"], [3]), ("dp4", ["--plan.pp", "1"], [0, 1, 2, 3])]


class Indexed(Tokens):
    """The char-LM tests' sequences, each with its index."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return (*super().__getitem__(i), i)


def loss(logits: torch.Tensor, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    value = char_lm.loss(logits, batch)
    if torch.is_grad_enabled():  # a training pass (the preflight check runs without grad)
        SEEN.append(([int(i) for i in batch[2]], value.item()))
    return value


def task() -> tandem.Task:
    return tandem.Task(model=partial(char_lm.CharLM, dim=16, layers=4, heads=2),
                       optimizer=adamw, train_data=partial(Indexed, N, T, 7), loss=loss,
                       tensor_parallel=char_lm.task.tensor_parallel)


# ---------------------------------------------------------------- FSDP2 shards' placement
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


def _placement(rank: int, world: int, pp: int, runtime: Runtime) -> None:
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


# ---------------------------------------------------------------- the runs
def _fit(rank: int, out: Path, name: str, args: list[str]) -> None:
    """One fit; rank 0 saves the weights, every rank what it trained on."""
    SEEN.clear()
    result = tandem.fit(task(), argv=args)
    Path(out, f"seen-{name}-{rank}.json").write_text(json.dumps(SEEN))
    if rank == 0:
        torch.save(result.model.state_dict(), out / f"{name}.pt")


def _runs(rank: int, world: int, out_dir: str) -> None:
    out = Path(out_dir)
    runtime = start(PlanConfig(strategy="fsdp"))
    try:
        for pp in SPLITS:
            _placement(rank, world, pp, runtime)
    finally:
        stop(runtime)
    common = ["--monitor.calibrate_at", "0", "--monitor.report", "false",
              "--checkpoint.async_save", "false"]
    _fit(rank, out, "pp2tp2", argv(out_dir, "pp2tp2", HALF, 2, "ZBVZeroBubble", 2)
         + ["--plan.tp", "2", *common])
    if rank == 0:  # before any rank can write a later checkpoint: the next fits need it
        for name in ("one", *(n for n, _, _ in LEGS)):
            shutil.copytree(out / "pp2tp2", out / name)
    for name, args, _ in LEGS:
        _fit(rank, out, name, argv(out_dir, name, STEPS, 2) + common + args)


@pytest.mark.timeout(330)
def test_pipeline_shards_and_tensor_parallel_peers(tmp_path: Path) -> None:
    run_ranks(_runs, 4, str(tmp_path), timeout=300)
    assert_weights(torch.load(tmp_path / "pp2tp2.pt"), reference(HALF)[0])
    # One process resumes here, in this process.
    SEEN.clear()
    one = tandem.fit(task(), argv=argv(str(tmp_path), "one", STEPS, 1)
                     + ["--monitor.calibrate_at", "0", "--monitor.report", "false"])
    Path(tmp_path, "seen-one-0.json").write_text(json.dumps(SEEN))
    torch.save(one.model.state_dict(), tmp_path / "one.pt")
    want, losses = reference(STEPS)
    order = epoch_order(SEED, 0, N).tolist()
    # The V-shaped schedule's last stage is the first process's (with the tied embedding).
    for name, ranks in (("pp2tp2", [0]), ("one", [0]), *((n, r) for n, _, r in LEGS)):
        seen = [s for r in ranks for s in json.loads((tmp_path / f"seen-{name}-{r}.json")
                                                      .read_text())]
        first, rest = (0, HALF) if name == "pp2tp2" else (HALF, STEPS)
        # Every sample of the leg's steps once, none of the other steps'.
        assert sorted(i for ids, _ in seen for i in ids) == sorted(
            order[first * GLOBAL:rest * GLOBAL]), name
        if name == "pp2tp2":
            continue
        assert_weights(torch.load(tmp_path / f"{name}.pt"), want)
        nxt = set(order[HALF * GLOBAL:(HALF + 1) * GLOBAL])  # the resumed leg's first step
        step = [v for ids, v in seen if set(ids) <= nxt]
        assert len(step) == GLOBAL // MICRO, name
        assert math.isclose(sum(step) / len(step), losses[HALF], rel_tol=1e-6), name
