"""The shared-memory group: the sum, mean and gather, the same bits on every rank,
DDP's training unchanged, and a dead or late peer named instead of a hang."""

from __future__ import annotations

import gc
import glob
import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.config import load
from tandem.parallel import hooks
from tandem.parallel.host_allreduce import SHM_DIR, SharedMemoryGroup, unsupported
from tests.dist.procs import run_ranks

pytestmark = pytest.mark.skipif(unsupported(torch.device("cpu")) is not None,
                                reason=f"{unsupported(torch.device('cpu'))}")


def _stop() -> None:
    """As tandem's own `runtime.stop`: destroying a gloo group while its worker thread still
    finishes the last collective can deadlock on the GIL (torch 2.13), and objects that
    hold the group must go first."""
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def _local(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank)).to(dtype)


def _sums(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        before = set(glob.glob(f"{SHM_DIR}/tandem-allreduce-*"))
        host = SharedMemoryGroup(None, slot_bytes=4096, timeout_s=30)  # 1,024 floats a slot
        report: dict[str, object] = {"left": sorted(set(glob.glob(
            f"{SHM_DIR}/tandem-allreduce-*")) - before), "slot": host.slot_bytes}
        for name, numel, dtype, mean in (("small", 10, torch.float32, False),
                                         ("pieces", 5000, torch.float32, False),
                                         ("mean", 3000, torch.float32, True),
                                         ("bf16", 700, torch.bfloat16, True)):
            mine = _local(rank, numel, dtype)
            got = host.all_reduce(mine.clone(), mean=mean)
            # Independent: every rank's tensor, regenerated here, summed in float64.
            want = sum(_local(r, numel, dtype).double() / (world if mean else 1)
                       for r in range(world))
            gathered = [torch.empty_like(got) for _ in range(world)]
            dist.all_gather(gathered, got)
            report[name] = {
                "error": float((got.double() - want).abs().max()),
                "scale": float(want.abs().max()),
                "same_bits": all(torch.equal(g.view(torch.uint8) if g.dtype != torch.bfloat16
                                             else g.view(torch.int16), got.view(torch.uint8)
                                             if got.dtype != torch.bfloat16
                                             else got.view(torch.int16)) for g in gathered)}
        mine = _local(rank, 3000, torch.float32).view(30, 100)
        gathered = host.all_gather(mine)  # 3 pieces of 1,024 floats
        report["gather"] = all(torch.equal(g, _local(r, 3000, torch.float32).view(30, 100))
                               for r, g in enumerate(gathered)) and len(gathered) == world
        report["rounds"] = host.round
        Path(out, f"{rank}.json").write_text(json.dumps(report))
        host.close()
    finally:
        _stop()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("world", [2, 3])
def test_sum_and_mean_match_an_independent_sum_with_the_same_bits_everywhere(
        tmp_path: Path, world: int) -> None:
    run_ranks(_sums, world, str(tmp_path), timeout=80)
    for r in range(world):
        report = json.loads((tmp_path / f"{r}.json").read_text())
        assert report["left"] == [], "the segment's name must be gone once all have mapped it"
        assert report["slot"] == 4096
        # 1 + 5 (5,000 floats in slots of 1,024) + 3 + 1 rounds, then a gather of 3.
        assert report["rounds"] == 13
        assert report["gather"]
        for name in ("small", "pieces", "mean"):
            assert report[name]["same_bits"], name
            assert report[name]["error"] <= 1e-6 * max(1.0, report[name]["scale"]), name
        assert report["bf16"]["same_bits"]
        assert report["bf16"]["error"] <= 2 ** -7 * report["bf16"]["scale"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 3))


def _train(rank: int, world: int, out: str) -> None:
    """Five SGD steps through DDP with the shared-memory hook, against a plain replica
    whose gradients are averaged by gloo's all-reduce."""
    dist.init_process_group("gloo")
    try:
        ddp = DistributedDataParallel(_model(), gradient_as_bucket_view=True)
        host = SharedMemoryGroup(None, slot_bytes=256, timeout_s=30)  # a bucket in 8 pieces
        stats = hooks.register(ddp, "none", backend="gloo", host=host)
        plain = _model()
        opt_a = torch.optim.SGD(ddp.parameters(), lr=0.1)
        opt_b = torch.optim.SGD(plain.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        worst = 0.0
        for _ in range(5):
            x, y = torch.randn(16, 12, generator=gen), torch.randint(0, 3, (16,), generator=gen)
            nn.functional.cross_entropy(ddp(x), y).backward()
            nn.functional.cross_entropy(plain(x), y).backward()
            for q in plain.parameters():
                dist.all_reduce(q.grad)
                q.grad /= world
            opt_a.step()
            opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()
            for a, b in zip(ddp.module.parameters(), plain.parameters(), strict=True):
                worst = max(worst, float((a - b).abs().max()))
        flat = torch.cat([q.detach().flatten() for q in ddp.module.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        Path(out, f"{rank}.json").write_text(json.dumps({
            "worst": worst, "replicas_equal": all(torch.equal(g, flat) for g in gathered),
            "buckets": stats.buckets, "bytes": stats.bytes_per_step(),
            "rounds": host.round}))
        del ddp, stats, opt_a  # DDP holds the hook's state: freed while the group lives
    finally:
        _stop()


@pytest.mark.timeout(90)
def test_ddp_trains_as_with_the_process_groups_all_reduce(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), timeout=80)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    params = sum(q.numel() for q in _model().parameters())
    for report in reports:
        assert report["replicas_equal"]
        assert report["worst"] <= 1e-6
        assert report["buckets"] == 1
        # Counted as DDP's own all-reduce is: ring bytes of every gradient, each step.
        assert report["bytes"] == pytest.approx(2 * (2 - 1) / 2 * params * 4)
        assert report["rounds"] == 5 * -(-params * 4 // 256)


def _peer_gone(rank: int, world: int, out: str, mode: str) -> None:
    dist.init_process_group("gloo")
    host = SharedMemoryGroup(None, slot_bytes=1024, timeout_s=1.5)
    if rank == 1:
        if mode == "dies":
            os._exit(0)  # no all-reduce, no goodbye
        time.sleep(4.0)  # alive, but never arrives in time
        os._exit(0)  # (a group whose peer left can hang the interpreter's exit)
    started = time.perf_counter()
    try:
        host.all_reduce(torch.ones(8))
        message = "no error"
    except dist.DistBackendError as err:
        message = f"{type(err).__name__}: {err}"
    Path(out, "0.json").write_text(json.dumps(
        {"message": message, "seconds": time.perf_counter() - started}))
    os._exit(0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["dies", "late"])
def test_a_dead_or_late_peer_is_named_instead_of_a_hang(tmp_path: Path, mode: str) -> None:
    run_ranks(_peer_gone, 2, str(tmp_path), mode, timeout=40)
    report = json.loads((tmp_path / "0.json").read_text())
    if mode == "dies":
        assert report["message"].startswith("DistBackendError")
        assert "rank(s) [1]" in report["message"] and "exited" in report["message"]
        assert report["seconds"] < 1.5  # seen by its pid, before the timeout
    else:
        assert report["message"].startswith("DistBackendError")
        assert "did not arrive" in report["message"]
        assert "rank(s) [1]" in report["message"] and "plan.timeout_s = 1.5" in report["message"]
        assert 1.5 <= report["seconds"] < 3.0


def test_unsupported_says_why() -> None:
    assert "cuda" in (unsupported(torch.device("cuda", 0)) or "")


@pytest.mark.parametrize("override", [{"plan.comm_hook": "fp16"}, {"plan.strategy": "fsdp"}])
def test_shared_memory_asked_for_where_it_cannot_apply_is_refused(
        override: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="plan.host_allreduce: 'shared_memory'"):
        load(overrides={"plan.host_allreduce": "shared_memory", **override})
