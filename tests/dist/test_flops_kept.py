"""A kept FLOP count is used only when every rank has it: the counting pass can hold
collectives (FSDP's gathers, tensor parallelism), so the ranks count together or not."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.dist.procs import run_ranks

SIGNATURE = "one-step"


def _calibrate(rank: int, world: int, out: str, kept_on: list[int]) -> None:
    from tandem.monitor import flops
    from tandem.monitor.calibrate import calibrate

    cache = Path(out, f"cache-{rank}")  # each rank its own machine, as on two nodes
    os.environ["TANDEM_CACHE_DIR"] = str(cache)
    cache.mkdir()
    if rank in kept_on:
        (cache / flops.FLOPS_FILE).write_text(json.dumps({SIGNATURE: 12345}))
    dist.init_process_group("gloo")
    try:
        passes = []
        layer = torch.nn.Linear(8, 4)
        x = torch.randn(5, 8)

        def one_pass(sync: bool) -> None:
            passes.append(sync)
            dist.all_reduce(torch.zeros(1))  # a collective inside the pass, as FSDP has
            layer(x).sum().backward()

        figures = calibrate(one_pass, device=torch.device("cpu"), world_size=world,
                            accum=1, grad_bytes=0, precision="fp32", communicates=False,
                            signature=SIGNATURE)
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"passes": len(passes), "flops": figures["flops/per_rank_step"]}))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kept_on", [[0], [0, 1]], ids=["one rank has it", "every rank"])
def test_every_rank_counts_unless_every_rank_has_the_count(tmp_path: Path,
                                                           kept_on: list[int]) -> None:
    run_ranks(_calibrate, 2, str(tmp_path), kept_on, timeout=100)
    got = [json.loads(Path(tmp_path, f"rank{r}.json").read_text()) for r in range(2)]
    # Linear(8, 4) on 5 rows: forward 2*5*8*4 FLOPs, backward as many again for the
    # weight's gradient (the input needs none)
    counted = 2 * 2 * 5 * 8 * 4
    if kept_on == [0, 1]:
        assert [g["passes"] for g in got] == [0, 0]
        assert [g["flops"] for g in got] == [12345, 12345]
    else:
        assert [g["passes"] for g in got] == [1, 1]
        assert [g["flops"] for g in got] == [counted, counted]
        # and now both keep it
        for r in range(2):
            kept = json.loads(Path(tmp_path, f"cache-{r}", "flops.json").read_text())
            assert kept[SIGNATURE] == counted
