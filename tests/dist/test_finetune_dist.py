"""Fine-tuning at two ranks: `run.init_from` a one-process run, and a DCP directory written
under another library's names (`Task.map_weights`), into FSDP2 with `train.freeze` (DCP
reshards the source into each rank's shards; the frozen shards keep the source's values),
LoRA under DDP against the same run in one process, and LoRA under FSDP2 (frozen base and
trained adapters in the same units) from a base's weights, its adapter-only checkpoints
resumed at two ranks and on one; a user's PEFT model under DDP, its adapter checkpoint
resumed on one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import tandem
from tests.dist import toy_task
from tests.dist.procs import run_ranks


class FullAtStart(tandem.Component):
    """The full weights when the run starts (gathered from the shards, every rank)."""

    def __init__(self, out: str, tag: str) -> None:
        self.out, self.tag = out, tag

    def setup(self, parts: tandem.components.RunParts) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        full = get_model_state_dict(parts.module, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if torch.distributed.get_rank() == 0:
            torch.save(full, Path(self.out, f"at_start{self.tag}.pt"))


def _from_other(key: str) -> str | None:
    """Keys of {"app": {"model": OtherNet's state dict}} -> the toy model's names."""
    layer, rest = key.removeprefix("app.model.").split(".", 1)
    return {"hidden": "0", "out": "2"}.get(layer, layer) + "." + rest


def _leg(rank: int, world: int, out: str, source: str, other: str) -> None:
    # a tandem run, then a DCP directory written under another library's names
    for tag, init_from, task in (("", source, toy_task.task()),
                                 ("-other", other, _mapped_task())):
        run = Path(out, f"run{tag}")
        run.mkdir(exist_ok=True)
        cfg = toy_task.config(str(run), 3, 20, plan={"strategy": "fsdp"})
        cfg.run.init_from, cfg.train.freeze = init_from, "0.*"
        result = tandem.fit(task, config=cfg, components=[FullAtStart(out, tag)])
        if rank == 0:
            torch.save(result.model.state_dict(), Path(out, f"final{tag}.pt"))


def _mapped_task() -> tandem.Task:
    task = toy_task.task()
    return tandem.Task(model=task.model, optimizer=task.optimizer,
                       train_data=task.train_data, loss=task.loss, map_weights=_from_other)


@pytest.mark.timeout(300)
def test_init_from_one_process_into_fsdp_shards_with_frozen_layers(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    src = tmp_path / "src"
    cfg = toy_task.config(str(src), 4, 20, checkpoint={"at_end": True})
    source = tandem.fit(toy_task.task(), config=cfg).model.state_dict()
    torch.manual_seed(5)
    hidden, head = nn.Linear(12, 32), nn.Linear(32, 3)
    other = {f"{name}.{k}": v for name, layer in (("hidden", hidden), ("out", head))
             for k, v in layer.state_dict().items()}
    dcp.save({"app": {"model": other}}, checkpoint_id=str(tmp_path / "other"))
    out = tmp_path / "ft"
    out.mkdir()
    run_ranks(_leg, 2, str(out), str(src / "toy"), str(tmp_path / "other"), timeout=240)
    for tag, weights in (("", source), ("-other", {_from_other(k): v for k, v in other.items()})):
        at_start = torch.load(out / f"at_start{tag}.pt", weights_only=True)
        final = torch.load(out / f"final{tag}.pt", weights_only=True)
        assert set(at_start) == set(weights)
        for name, value in weights.items():
            assert torch.equal(at_start[name], value), (tag, name)
        for name in ("0.weight", "0.bias"):
            assert torch.equal(final[name], weights[name]), (tag, name)
        assert not torch.equal(final["2.weight"], weights["2.weight"])


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


def _lora_fsdp_leg(rank: int, world: int, out: str, base: str) -> None:
    # 2 steps, then the same run resumed from its step-2 checkpoint to step 4
    for steps in (2, 4):
        cfg = toy_task.config(out, steps, 20, run={"init_from": base},
                              plan={"strategy": "fsdp"}, train={"lora_rank": 2},
                              checkpoint={"every": 2, "async_save": False})
        result = tandem.fit(toy_task.task(), config=cfg)
    if rank == 0:
        torch.save(result.model.state_dict(), Path(out, "final.pt"))


def _lora_from(run_dir: Path, base: str, steps: int) -> dict[str, torch.Tensor]:
    cfg = toy_task.config(str(run_dir), steps, 20, run={"init_from": base},
                          train={"lora_rank": 2}, checkpoint={"every": 2, "async_save": False})
    return tandem.fit(toy_task.task(), config=cfg).model.state_dict()


@pytest.mark.timeout(300)
def test_lora_under_fsdp2_resumes_its_adapter_checkpoints_at_two_ranks_and_one(
        tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from tandem import checkpoint

    torch.manual_seed(3)
    base = str(tmp_path / "base.safetensors")
    save_file(toy_task.make_model().state_dict(), base)
    out = tmp_path / "fsdp"
    out.mkdir()
    run_ranks(_lora_fsdp_leg, 2, str(out), base, timeout=240)
    # the checkpoints hold the adapters (whole, not one rank's slice), not the base
    saved = dcp.FileSystemReader(str(checkpoint.latest(out / "toy" / "checkpoints")))
    shapes = {k.removeprefix("model."): tuple(v.size) for k, v in
              saved.read_metadata().state_dict_metadata.items() if k.startswith("model.")}
    assert shapes == {"0.lora_A.weight": (2, 12), "0.lora_B.weight": (32, 2),
                      "2.lora_A.weight": (2, 32), "2.lora_B.weight": (3, 2)}
    reference = _lora_from(tmp_path / "one", base, 6)
    four = _lora_from(tmp_path / "one4", base, 4)
    two = torch.load(out / "final.pt", weights_only=True)
    assert set(two) == set(four)
    for name, value in four.items():
        torch.testing.assert_close(two[name], value, rtol=0, atol=1e-6, msg=name)
    # the two-rank run's adapter checkpoint, resumed on one process
    resumed = _lora_from(out, base, 6)
    for name, value in reference.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-6, msg=name)
    frozen = {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert all(torch.equal(resumed[n], value) for n, value in
               torch.load(out / "final.pt", weights_only=True).items() if n in frozen)
    assert not torch.equal(resumed["2.lora_B.weight"], torch.zeros(3, 2))


def _peft_leg(rank: int, world: int, out: str) -> None:
    from tests.unit.test_finetune_peft import peft_task

    cfg = toy_task.config(out, 3, 20, plan={"strategy": "ddp"},
                          checkpoint={"every": 3, "async_save": False})
    tandem.fit(peft_task(), config=cfg)


@pytest.mark.timeout(300)
def test_a_peft_model_under_ddp_resumes_its_adapters_on_one_process(tmp_path: Path) -> None:
    from tests.unit.test_finetune_peft import peft_task

    out = tmp_path / "two"
    out.mkdir()
    run_ranks(_peft_leg, 2, str(out), timeout=240)
    from tandem import checkpoint
    from tests.unit.test_finetune_peft import ADAPTERS

    saved = checkpoint.manifest.read(checkpoint.latest(out / "toy" / "checkpoints"))["shapes"]
    assert {k.removeprefix("model.") for k in saved if k.startswith("model.")} == ADAPTERS
    cfg = toy_task.config(str(tmp_path / "one"), 6, 20)
    reference = tandem.fit(peft_task(), config=cfg).model.state_dict()
    resumed = tandem.fit(peft_task(), config=toy_task.config(str(out), 6, 20)).model
    assert resumed.state_dict().keys() == reference.keys()
    for name, value in reference.items():
        torch.testing.assert_close(resumed.state_dict()[name], value, rtol=0, atol=1e-6,
                                   msg=name)
