"""Fine-tuning at two ranks: `run.init_from` a one-process run into FSDP2 with `train.freeze`
(DCP reshards the source into each rank's shards; the frozen shards keep the source's
values), and LoRA under DDP against the same run in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks


class FullAtStart(tandem.Component):
    """The full weights when the run starts (gathered from the shards, every rank)."""

    def __init__(self, out: str) -> None:
        self.out = out

    def setup(self, parts: tandem.components.RunParts) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = get_model_state_dict(parts.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if torch.distributed.get_rank() == 0:
            torch.save(full, Path(self.out, "at_start.pt"))


def _leg(rank: int, world: int, out: str, source: str) -> None:
    cfg = toy_task.config(out, 3, 20, plan={"strategy": "fsdp"})
    cfg.run.init_from, cfg.train.freeze = source, "0.*"
    result = tandem.fit(toy_task.task(), config=cfg, components=[FullAtStart(out)])
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "final.pt"))


@pytest.mark.timeout(300)
def test_init_from_one_process_into_fsdp_shards_with_frozen_layers(tmp_path: Path) -> None:
    src = tmp_path / "src"
    cfg = toy_task.config(str(src), 4, 20, checkpoint={"at_end": True})
    source = tandem.fit(toy_task.task(), config=cfg).model.state_dict()
    out = tmp_path / "ft"
    out.mkdir()
    run_ranks(_leg, 2, str(out), str(src / "toy"), timeout=240)
    at_start = torch.load(out / "at_start.pt", weights_only=True)
    final = torch.load(out / "final.pt", weights_only=True)
    for name, value in source.items():
        assert torch.equal(at_start[name], value), name
    for name in ("0.weight", "0.bias"):
        assert torch.equal(final[name], source[name]), name
    assert not torch.equal(final["2.weight"], source["2.weight"])


def _lora_leg(rank: int, world: int, out: str) -> None:
    cfg = toy_task.config(out, 4, 20, plan={"strategy": "ddp"})
    cfg.train.lora_rank = 2
    result = tandem.fit(toy_task.task(), config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "final.pt"))


@pytest.mark.timeout(300)
def test_lora_under_ddp_trains_what_one_process_trains(tmp_path: Path) -> None:
    one = toy_task.config(str(tmp_path / "one"), 4, 20)
    one.train.lora_rank = 2
    reference = tandem.fit(toy_task.task(), config=one).model.state_dict()
    out = tmp_path / "two"
    out.mkdir()
    run_ranks(_lora_leg, 2, str(out), timeout=240)
    two = torch.load(out / "final.pt", weights_only=True)
    assert set(two) == set(reference)
    for name, value in reference.items():
        torch.testing.assert_close(two[name], value, rtol=1e-5, atol=1e-6, msg=name)
