"""Checkpoints across world sizes on real gloo process groups: 2 ranks <-> 1 process."""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.checkpoint import CheckpointError, capture, latest, load, restore, save

WORLD = 2
STEP = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def save_worker(rank: int, port: int, root: str, side: str, blocker: str) -> None:
    init(rank, port)
    try:
        model, optim = build(seed=0)
        ddp = DistributedDataParallel(model)
        train(ddp, optim, seed=100 + rank)
        state = capture(ddp, optim)
        assert not any(k.startswith("module.") for k in state["model"]), list(state["model"])
        if rank == 0:
            torch.save(flat_tensors(state), side)
        path = save(Path(root), STEP, state, {"step": STEP, "world": WORLD}, keep=1)
        assert latest(Path(root)) == path
        # A bad root must fail on every rank (not hang the others) and change nothing.
        try:
            save(Path(blocker) / "ckpt", STEP + 1, state, {}, keep=1)
        except CheckpointError as err:
            assert "ckpt" in str(err)
        else:
            raise AssertionError(f"rank {rank}: save into an unusable root did not raise")
        assert latest(Path(root)) == path
    finally:
        dist.destroy_process_group()


def load_worker(rank: int, port: int, root: str, side: str) -> None:
    init(rank, port)
    try:
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
    finally:
        dist.destroy_process_group()


@pytest.fixture
def gloo_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.mark.timeout(120)
def test_ddp_two_ranks_save_loads_into_one_plain_process(tmp_path: Path, gloo_env: None) -> None:
    root, side, blocker = tmp_path / "ckpt", tmp_path / "side.pt", tmp_path / "file"
    blocker.write_text("a file, so nothing can be created under it")
    mp.spawn(save_worker, args=(free_port(), str(root), str(side), str(blocker)), nprocs=WORLD)

    path = latest(root)
    assert path == root / f"step_{STEP:09d}"
    assert sorted(p.name for p in path.iterdir() if p.suffix == ".distcp") == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    model, optim = build(seed=1)
    state = capture(model, optim)
    assert load(path, state) == {"step": STEP, "world": WORLD}
    restore(model, optim, state)
    expected = torch.load(side, weights_only=True)
    got = flat_tensors(capture(model, optim))
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


@pytest.mark.timeout(120)
def test_one_plain_process_save_loads_into_two_ddp_ranks(tmp_path: Path, gloo_env: None) -> None:
    root, side = tmp_path / "ckpt", tmp_path / "side.pt"
    model, optim = build(seed=0)
    train(model, optim, seed=7)
    state = capture(model, optim)
    torch.save(flat_tensors(state), side)
    save(root, STEP, state, {"step": STEP, "world": 1}, keep=1)
    mp.spawn(load_worker, args=(free_port(), str(root), str(side)), nprocs=WORLD)
