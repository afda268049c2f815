"""Checkpoints across world sizes on real gloo process groups: 2 ranks <-> 1 process.

Every comparison is against tensors the saving side wrote with plain ``torch.save``,
never against tandem's own loading.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from tandem.checkpoint import (
    CheckpointError,
    capture,
    latest,
    load,
    read_meta,
    restore,
    save,
)
from tests.dist.procs import free_port

WORLD = 2
STEP = 6
# Below the pytest timeout, so a hung rank is killed here and reported, not orphaned.
SPAWN_TIMEOUT_S = 90


def build(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def flat_tensors(state: dict) -> dict[str, torch.Tensor]:
    """Every tensor of a captured state, by dotted key, as plain detached copies."""
    out = {f"model.{k}": v.detach().clone() for k, v in state["model"].items()}
    for fqn, slots in state["optim"]["state"].items():
        for slot, value in slots.items():
            out[f"optim.{fqn}.{slot}"] = value.detach().clone()
    return out


def train(model: nn.Module, optim: torch.optim.Optimizer, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        model(torch.randn(4, 6, generator=gen)).square().mean().backward()
        optim.step()
        optim.zero_grad()


def init(rank: int, port: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )


def in_group(rank: int, body: Callable[..., None], port: int, *args: str) -> None:
    """Run ``body`` in a gloo group, then destroy the group.

    ``body`` is its own frame so its DDP module (whose reducer holds a reference to the
    group) is gone before the group is destroyed.
    """
    init(rank, port)
    try:
        body(rank, *args)
    finally:
        # FSDP2 modules hold their group in reference cycles; freed only at exit, after
        # the group is gone, gloo sometimes aborts the process (as tandem.runtime.stop).
        gc.collect()
        dist.destroy_process_group()


def spawn(body: Callable[..., None], *args: str) -> None:
    """Run ``body`` on WORLD spawned ranks; fail (and kill them) if any hangs or fails."""
    context = mp.start_processes(
        in_group, args=(body, free_port(), *args), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{body.__name__} ranks still running after {SPAWN_TIMEOUT_S}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(timeout=10)


def save_body(rank: int, root: str, side: str, blocker: str) -> None:
    model, optim = build(seed=0)
    ddp = DistributedDataParallel(model)
    train(ddp, optim, seed=100 + rank)
    state = capture(ddp, optim)
    assert not any(k.startswith("module.") for k in state["model"]), list(state["model"])
    if rank == 0:
        torch.save(flat_tensors(state), Path(side) / "ddp.pt")
    path = save(Path(root) / "ddp", STEP, state, {"step": STEP, "world": WORLD}, keep=1)
    assert latest(Path(root) / "ddp") == path
    # A bad root must fail on every rank (not hang the others) and change nothing.
    with pytest.raises(CheckpointError, match="file/ckpt"):
        save(Path(blocker) / "ckpt", STEP + 1, state, {}, keep=1)
    assert latest(Path(root) / "ddp") == path
    save_fsdp(rank, Path(root) / "fsdp", Path(side) / "fsdp.pt")


def save_fsdp(rank: int, root: Path, side: Path) -> None:
    model, optim = build(seed=0)
    fully_shard(model, mesh=init_device_mesh("cpu", (WORLD,)))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    train(model, optim, seed=100 + rank)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_full, optim_full = get_state_dict(model, optim, options=full)
    if rank == 0:
        torch.save(flat_tensors({"model": model_full, "optim": optim_full}), side)
    save(root, STEP, capture(model, optim), {"step": STEP, "world": WORLD}, keep=1)


def load_body(rank: int, root: str, side: str) -> None:
    model, optim = build(seed=1)
    ddp = DistributedDataParallel(model)
    path = latest(Path(root))
    assert path is not None and path.name == f"step_{STEP:09d}"
    state = capture(ddp, optim)
    assert load(path, state) == {"step": STEP, "world": 1}
    restore(ddp, optim, state)
    expected = torch.load(side, weights_only=True)
    got = flat_tensors(capture(ddp, optim))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), f"rank {rank}: {key}"


@pytest.fixture
def gloo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.timeout(120)
def test_two_rank_saves_load_into_one_plain_process(tmp_path: Path, gloo_env: None) -> None:
    root, blocker = tmp_path / "ckpt", tmp_path / "file"
    blocker.write_text("a file, so nothing can be created under it")
    spawn(save_body, str(root), str(tmp_path), str(blocker))

    for wrapping in ("ddp", "fsdp"):
        path = latest(root / wrapping)
        assert path == root / wrapping / f"step_{STEP:09d}"
        shards = sorted(p.name for p in path.iterdir() if p.suffix == ".distcp")
        assert shards == ["__0_0.distcp", "__1_0.distcp"], wrapping
        # FSDP2 shards each weight in two; the manifest must still hold global shapes.
        shapes = json.loads((path / "manifest.json").read_text())["shapes"]
        assert shapes["model.0.weight"] == [16, 6], wrapping
        assert shapes["optim.state.0.weight.exp_avg"] == [16, 6], wrapping
        assert read_meta(path) == {"step": STEP, "world": WORLD}
        model, optim = build(seed=1)
        state = capture(model, optim)
        assert load(path, state) == {"step": STEP, "world": WORLD}
        restore(model, optim, state)
        expected = torch.load(tmp_path / f"{wrapping}.pt", weights_only=True)
        got = flat_tensors(capture(model, optim))
        assert got.keys() == expected.keys(), wrapping
        for key, value in expected.items():
            assert torch.equal(got[key], value), f"{wrapping}: {key}"


@pytest.mark.timeout(120)
def test_one_plain_process_save_loads_into_two_ddp_ranks(tmp_path: Path, gloo_env: None) -> None:
    root, side = tmp_path / "ckpt", tmp_path / "side.pt"
    model, optim = build(seed=0)
    train(model, optim, seed=7)
    state = capture(model, optim)
    torch.save(flat_tensors(state), side)
    save(root, STEP, state, {"step": STEP, "world": 1}, keep=1)
    spawn(load_body, str(root), str(side))
