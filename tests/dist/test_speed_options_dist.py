"""Training-speed options on real process groups: in-memory batches keep the global sample
order (1 and 2 processes, and across a resume); weight averaging under DDP and FSDP equals
the average of a plain one-process run."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

import tandem
from tandem.parallel.host_allreduce import SharedMemoryGroup, unsupported
from tests.dist import toy_task
from tests.dist.procs import run_ranks

GLOBAL = 20


def _seen(rank: int, world: int, out: str, steps: int, tag: str, memory: bool) -> None:
    cfg = toy_task.config(out, steps, GLOBAL, checkpoint={"every": 3},
                          data={"in_memory": memory})
    cfg.run.name = f"toy-{memory}"
    toy_task.SEEN.clear()
    tandem.fit(toy_task.task(), config=cfg)
    Path(out, f"seen-{tag}-{rank}.json").write_text(json.dumps(toy_task.SEEN))


def _trained(out: Path, tag: str, world: int, steps: int) -> list[int]:
    """The global order trained in one leg: each step's rank slices, rank after rank."""
    seen = [json.loads((out / f"seen-{tag}-{r}.json").read_text()) for r in range(world)]
    share = GLOBAL // world
    return [i for step in range(steps) for r in range(world)
            for i in seen[r][step * share:(step + 1) * share]]


@pytest.mark.timeout(270)  # its four runs' own timeouts, and a margin
def test_in_memory_batches_hold_the_dataloaders_samples(tmp_path: Path) -> None:
    run_ranks(_seen, 1, str(tmp_path), 11, "loader", False, timeout=60)
    loader = _trained(tmp_path, "loader", 1, 11)
    assert loader == toy_task.reference(11, GLOBAL)[1]
    run_ranks(_seen, 1, str(tmp_path), 11, "memory1", True, timeout=60)
    assert _trained(tmp_path, "memory1", 1, 11) == loader
    # 2 processes to step 6 (a checkpoint at 6), then 1 process on to step 11.
    run_ranks(_seen, 2, str(tmp_path / "r"), 6, "memory2", True, timeout=60)
    run_ranks(_seen, 1, str(tmp_path / "r"), 11, "resumed", True, timeout=60)
    both = _trained(tmp_path / "r", "memory2", 2, 6) + _trained(tmp_path / "r", "resumed", 1, 5)
    assert both == loader


def hand_average(steps: int, decay: float) -> dict[str, torch.Tensor]:
    """toy_task's plain one-process run, averaging the weights after every step."""
    from tandem.runtime import derive_seed

    torch.manual_seed(derive_seed("build", 7))
    data, model = toy_task.IndexedData(), toy_task.make_model()
    opt = toy_task.make_optimizer(model.parameters())
    average = {n: p.detach().clone() for n, p in model.named_parameters()}
    for step, ids in enumerate(toy_task.global_batches(steps, GLOBAL, 7)):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
        opt.step()
        d = min(decay, (1 + step) / (10 + step))
        for n, p in model.named_parameters():
            average[n] = d * average[n] + (1 - d) * p.detach()
    return average


def _averaged(rank: int, world: int, out: str, strategy: str, reshard: bool) -> None:
    cfg = toy_task.config(out, 9, GLOBAL, train={"ema_decay": 0.8, "eval_every": 2},
                          plan={"strategy": strategy, "fsdp_reshard": reshard})
    task = dataclasses.replace(toy_task.task(), eval_data=toy_task.IndexedData)
    result = tandem.fit(task, config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "averaged.pt"))


@pytest.mark.timeout(150)
@pytest.mark.parametrize(("strategy", "reshard"), [("ddp", True), ("fsdp", False)])
def test_average_under_ddp_and_fsdp_is_the_one_process_average(
        tmp_path: Path, strategy: str, reshard: bool) -> None:
    # Evaluations every 2 steps swap the average in and out: under FSDP without
    # resharding after forward, a stale gathered copy would leak into training.
    run_ranks(_averaged, 2, str(tmp_path), strategy, reshard, timeout=100)
    got = torch.load(tmp_path / "averaged.pt", weights_only=True)
    want = hand_average(9, 0.8)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


def _muon_shared(rank: int, world: int, out: str) -> None:
    import torch.distributed as dist

    from tandem.optim import Muon

    dist.init_process_group("gloo")
    try:
        gen = torch.Generator().manual_seed(5)
        shapes = [(16, 40), (40, 16), (8, 3, 5), (24, 24), (6,)]
        start = [torch.randn(*s, generator=gen) for s in shapes]
        # steps 1-4 orthogonalise alone, 5-8 shared (both timed), then the faster way
        steps = 2 * Muon.TRIAL_STEPS + 2
        grads = [[torch.randn(*s, generator=gen) for s in shapes] for _ in range(steps)]
        results = []
        host = SharedMemoryGroup(None, 1024, 30) if unsupported(torch.device("cpu")) is None \
            else None  # gathers in pieces of 256 floats
        for share in ("alone", "process group", "shared memory"):
            if share == "shared memory" and host is None:
                continue
            params = [torch.nn.Parameter(w.clone()) for w in start]
            opt = Muon([{"params": params[:4]},
                        {"params": params[4:], "muon": False, "lr": 1e-3}], lr=0.03)
            if share == "process group":  # timed both ways, then the faster one
                opt.share_work(None)
            elif share == "shared memory":  # shared from the first step on
                opt.share_work(None, host)
                opt._sharing, opt._trial = True, None
            for step in grads:
                for p, g in zip(params, step, strict=True):
                    p.grad = g.clone()
                opt.step()
            results.append([p.detach() for p in params])
            if share == "process group":
                decided = [None] * world
                dist.all_gather_object(decided, (opt.shares_work, opt.sharing_timed))
        if rank == 0:
            torch.save({"alone": results[0], "shared": results[1:], "decided": decided},
                       Path(out, "muon.pt"))
        dist.barrier()  # no gloo collective in flight when the group goes (torch 2.13)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(160)
def test_muon_shared_over_two_ranks_equals_each_rank_alone(tmp_path: Path) -> None:
    run_ranks(_muon_shared, 2, str(tmp_path), timeout=150)
    got = torch.load(tmp_path / "muon.pt", weights_only=False)
    assert len(got["shared"]) == (2 if unsupported(torch.device("cpu")) is None else 1)
    for shared in got["shared"]:  # through the process group, and through shared memory
        for alone, mine in zip(got["alone"], shared, strict=True):
            assert torch.equal(alone, mine)
    # both processes timed both ways and took the same, faster one
    (share0, timed0), (share1, timed1) = got["decided"]
    assert timed0 is not None and timed0 == timed1 and share0 == share1
    assert share0 == (timed0[1] < timed0[0])
