"""Pipeline parallelism (plan.pp) trains what one plain PyTorch process trains.

The char-LM example's transformer (small, its embedding tied to its head) under every
schedule PyTorch offers, run one after another by the same two processes; the reference
is a plain single-process loop over the same global batches, accumulating the same
micro-batches, with gradient clipping that engages. A pipeline's checkpoint resumes on
one process and one process's on a pipeline, optimizer state and sample order included;
so do those of pipelines whose stages are replicated (DDP) or sharded (FSDP2).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

import tandem
from tandem.data.sampler import epoch_order
from tandem.monitor.catalogue import PP_BUBBLE_PREDICTED
from tandem.monitor.store import RunStore
from tandem.runtime import derive_seed
from tests.dist.procs import run_ranks
from tests.dist.token_data import Tokens, adamw, char_lm_task
from tests.dist.toy_task import global_batches

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import char_lm  # noqa: E402

N, T, GLOBAL, MICRO, SEED, CLIP, STEPS = 64, 8, 8, 2, 5, 0.5, 6
SCHEDULES = [("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("LoopedBFS", 2),
             ("InterleavedZeroBubble", 2), ("ZBVZeroBubble", 2), ("DualPipeV", 2)]


def task() -> tandem.Task:
    return char_lm_task(7, N, T, dim=16, layers=4, heads=2)


def argv(out: str, name: str, steps: int, pp: int, schedule: str = "1F1B",
         virtual: int = 1, strategy: str = "auto") -> list[str]:
    return ["--run.dir", out, "--run.name", name, "--run.seed", str(SEED),
            "--plan.strategy", strategy,
            "--train.steps", str(steps), "--train.global_batch", str(GLOBAL),
            "--train.micro_batch", str(MICRO), "--train.grad_clip", str(CLIP),
            "--plan.pp", str(pp), "--plan.pp_schedule", schedule,
            "--plan.pp_virtual", str(virtual), "--precision.mode", "fp32",
            "--monitor.progress", "off", "--monitor.log_every", "3",
            "--monitor.calibrate_at", "2",  # a calibration pass of the step's micro-batches
            "--checkpoint.at_end", "true", "--checkpoint.every", "3"]


def _schedules(rank: int, world: int, out: str) -> None:
    """Every schedule, one fit after another in the same two processes."""
    for schedule, virtual in SCHEDULES:
        result = tandem.fit(task(), argv=argv(out, schedule, STEPS, 2, schedule, virtual))
        if rank == 0:
            torch.save({"state": result.model.state_dict(), "summary": result.summary},
                       Path(out, f"{schedule}.pt"))


def reference(steps: int, micro: int = MICRO) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, plain PyTorch: the documented order, the global batch in micro-batches
    of `micro`, each loss / their number; clipped; the losses of every step."""
    torch.manual_seed(derive_seed("build", SEED))
    data = Tokens(N, T, 7)
    model = task().model()
    opt = adamw(model.parameters())
    losses = []
    for ids in global_batches(steps, GLOBAL, SEED, N):
        opt.zero_grad()
        total = 0.0
        for part in ids.split(micro):
            loss = char_lm.loss(model(data.x[part, :-1]), (None, data.x[part, 1:]))
            (loss / (GLOBAL // micro)).backward()
            total += loss.item() / (GLOBAL // micro)
        losses.append(total)
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
    return model.state_dict(), losses


def assert_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(150)
def test_every_schedule_trains_what_one_process_trains(tmp_path: Path) -> None:
    run_ranks(_schedules, 2, str(tmp_path), timeout=140)
    want, losses = reference(STEPS)
    for schedule, _ in SCHEDULES:
        got = torch.load(tmp_path / f"{schedule}.pt", weights_only=False)
        assert got["summary"]["steps"] == STEPS, schedule
        assert_weights(got["state"], want)
        # Every schedule's action table replays: each stage's predicted idle share.
        with RunStore(tmp_path / "tandem.db") as store:
            rows = store.metrics(store.run(schedule)["run_id"], name=PP_BUBBLE_PREDICTED)
        assert {r["rank"] for r in rows} == {-1, 0, 1}, schedule
        assert all(0.0 <= r["value"] < 1.0 for r in rows), schedule


def _fit(rank: int, world: int, out: str, runs: list[tuple[str, int, int]]) -> None:
    """Fit each (name, steps, pp) in turn; rank 0 saves the weights."""
    _fits(rank, world, out, [(name, argv(out, name, steps, pp)) for name, steps, pp in runs])


def _fits(rank: int, world: int, out: str, runs: list[tuple[str, list[str]]]) -> None:
    """Fit each (name, argv) in turn; rank 0 saves the weights."""
    for name, args in runs:
        result = tandem.fit(task(), argv=args)
        if rank == 0:
            torch.save({"state": result.model.state_dict(), "summary": result.summary},
                       Path(out, f"{name}.pt"))


@pytest.mark.timeout(240)
def test_checkpoints_move_between_pipelines_and_one_process(tmp_path: Path) -> None:
    # "a": 3 steps on a 2-stage pipeline, then 3 more on one process; "b" the other way;
    # "c": 3 on two stages, 3 on four (every stage boundary moves). Weights within 1e-5
    # of the reference after the 6 steps: the optimizer state of every stage came along,
    # and the sample order went on where it stopped.
    half = STEPS // 2
    run_ranks(_fit, 2, str(tmp_path), [("a", half, 2), ("c", half, 2)], timeout=90)
    run_ranks(_fit, 1, str(tmp_path), [("a", STEPS, 1), ("b", half, 1)], timeout=60)
    run_ranks(_fit, 2, str(tmp_path), [("b", STEPS, 2)], timeout=60)
    run_ranks(_fit, 4, str(tmp_path), [("c", STEPS, 4)], timeout=120)
    want, _ = reference(STEPS)
    for name in ("a", "b", "c"):
        got = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        assert got["summary"]["steps"] == STEPS
        assert_weights(got["state"], want)


@pytest.mark.timeout(150)
def test_a_stuck_schedule_is_stopped_and_named(tmp_path: Path) -> None:
    # Stage 1's last block sleeps in a forward of step 3 or so: the watchdog stops the run
    # within seconds of plan.pp_watchdog_s, naming the schedule, the stage and the action.
    stall_file = tmp_path / "stalled_at"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               STALL_AFTER="12", STALL_FILE=str(stall_file))
    cmd = [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", "2",
           str(ROOT / "tests" / "dist" / "scripts" / "pipeline_stall.py"),
           "--plan.pp", "2", "--plan.pp_schedule", "1F1B", "--plan.pp_watchdog_s", "5",
           "--train.steps", "40", "--train.global_batch", "8", "--train.micro_batch", "2",
           "--monitor.log_every", "40", "--monitor.calibrate_at", "0",
           "--checkpoint.every", "0", "--run.dir", str(tmp_path), "--monitor.progress", "off"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=140)
    ended = time.time()
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert stall_file.exists(), out
    assert ended - float(stall_file.read_text()) < 60, out
    assert ("pipeline schedule '1F1B' made no progress for 5 s (plan.pp_watchdog_s) on "
            "stage 1, action F of micro-batch") in out, out


@pytest.mark.timeout(240)
def test_pipeline_replicas_or_shards_train_what_one_process_trains(tmp_path: Path) -> None:
    # Four processes for half the steps, as PP2 x DP2 (the replicas' stage gradients
    # averaged) and then as PP2 x FSDP2 (each stage's parameters sharded over its two data
    # ranks, gradients reduce-scattered, the norm clipped over every shard of every stage);
    # each replica or shard draws its half of every global batch. The rest of the steps on
    # one process: the resharded checkpoints (the FSDP2 one of DTensor shards under the
    # whole model's names), optimizer state included, give the one-process weights; and
    # the other way, a one-process checkpoint resumes as PP2 x FSDP2 ("onefsdp").
    # Then every multi-stage schedule under FSDP2, two stages per process (the V-shaped
    # ones hold the embedding and the head tied to it), at four micro-batches per shard.
    half, out = STEPS // 2, str(tmp_path)
    run_ranks(_fit, 1, out, [("onefsdp", half, 1)], timeout=60)
    multi = [(schedule, argv(out, schedule, half, 2, schedule, virtual, "fsdp")
              + ["--train.micro_batch", "1"]) for schedule, virtual in SCHEDULES if virtual > 1]
    run_ranks(_fits, 4, out, [("pp2dp2", argv(out, "pp2dp2", half, 2)),
                              ("pp2fsdp2", argv(out, "pp2fsdp2", half, 2, strategy="fsdp")),
                              ("onefsdp", argv(out, "onefsdp", STEPS, 2, strategy="fsdp")),
                              *multi], timeout=230)
    for name, strategy, micro in (("pp2dp2", "pp", MICRO), ("pp2fsdp2", "pp_fsdp", MICRO),
                                  *((name, "pp_fsdp", 1) for name, _ in multi)):
        first = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        assert (first["summary"]["world_size"], first["summary"]["steps"]) == (4, half)
        with RunStore(tmp_path / "tandem.db") as store:
            assert store.run(name)["plan"]["strategy"] == strategy
        assert_weights(first["state"], reference(half, micro)[0])
    run_ranks(_fit, 1, out, [("pp2dp2", STEPS, 1), ("pp2fsdp2", STEPS, 1)], timeout=60)
    want = reference(STEPS)[0]
    for name, world in (("pp2dp2", 1), ("pp2fsdp2", 1), ("onefsdp", 4)):
        got = torch.load(tmp_path / f"{name}.pt", weights_only=False)
        assert (got["summary"]["steps"], got["summary"]["world_size"]) == (STEPS, world)
        assert_weights(got["state"], want)
        with RunStore(tmp_path / "tandem.db") as store:  # resumed, not trained afresh
            events = store.events(store.run(name)["run_id"])
        assert [e["step"] for e in events if e["kind"] == "resume"] == [half], name


@pytest.mark.timeout(150)
def test_a_sequence_length_ramp_rebuilds_the_schedule(tmp_path: Path) -> None:
    # Half-length sequences for 3 steps, then whole ones: the stages' activation shapes
    # change mid-run, so the schedule is built again (a stale one sends tensors of the
    # old size); the weights match one process with the same ramp.
    ramp = ["--train.seq_ramp", "0:4,3:0"]
    run_ranks(_fits, 2, str(tmp_path), [("ramp-pp", argv(str(tmp_path), "ramp-pp", STEPS, 2)
                                         + ramp)], timeout=90)
    run_ranks(_fits, 1, str(tmp_path), [("ramp-one", argv(str(tmp_path), "ramp-one", STEPS, 1)
                                         + ramp)], timeout=60)
    got, want = (torch.load(tmp_path / f"{n}.pt", weights_only=False) for n in ("ramp-pp",
                                                                                 "ramp-one"))
    assert got["summary"]["steps"] == STEPS
    assert_weights(got["state"], want["state"])
