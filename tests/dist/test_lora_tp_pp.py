"""LoRA under tensor parallelism (plan.tp 2: adapters split with their column-/row-wise
layers) and under pipeline parallelism (plan.pp 2: adapters inside the stages), on two
processes, from a base model's safetensors: 3 steps, an adapter-only checkpoint, a resume
to 6 steps; the weights match the same LoRA run on one process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import tandem
from tandem import checkpoint
from tests.dist.procs import run_ranks
from tests.dist.token_data import char_lm_task

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import char_lm  # noqa: E402

PLANS = {"tp": {"tp": 2}, "pp": {"pp": 2, "pp_schedule": "1F1B"}}


def _task() -> tandem.Task:
    return char_lm_task(7, 32, 8, dim=16, layers=2, heads=2, tensor_parallel=True)


def _config(out: str, name: str, steps: int, base: str, plan: dict) -> tandem.Config:
    cfg = tandem.Config()
    cfg.run.dir, cfg.run.name, cfg.run.seed, cfg.run.init_from = out, name, 5, base
    cfg.train.steps, cfg.train.global_batch, cfg.train.micro_batch = steps, 8, 2
    cfg.train.lora_rank, cfg.train.lora_alpha, cfg.train.lora_targets = 2, 4.0, "blocks.*"
    cfg.precision.mode, cfg.monitor.progress, cfg.monitor.report = "fp32", "off", False
    cfg.checkpoint.every, cfg.checkpoint.async_save = 3, False
    for key, value in plan.items():
        setattr(cfg.plan, key, value)
    return cfg


def _fit(out: str, name: str, steps: int, base: str, plan: dict) -> dict[str, torch.Tensor]:
    result = tandem.fit(_task(), config=_config(out, name, steps, base, plan))
    return {k: v.detach().clone() for k, v in result.model.state_dict().items()}


def _leg(rank: int, world: int, out: str, base: str, name: str) -> None:
    _fit(out, name, 3, base, PLANS[name])  # stops after its step-3 checkpoint
    final = _fit(out, name, 6, base, PLANS[name])  # resumes from it
    if rank == 0:
        torch.save(final, Path(out, f"{name}.pt"))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["tp", "pp"])
def test_lora_trains_what_one_process_trains_and_resumes_from_adapters(
        tmp_path: Path, name: str) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(2)
    base = str(tmp_path / "base.safetensors")
    # the tied embedding and head are one tensor: saved under both names, as copies
    save_file({k: v.clone() for k, v in char_lm.CharLM(dim=16, layers=2, heads=2)
               .state_dict().items()}, base)
    run_ranks(_leg, 2, str(tmp_path), base, name, timeout=260)
    ckpt = checkpoint.latest(tmp_path / name / "checkpoints")
    saved = {k for k in checkpoint.manifest.read(ckpt)["shapes"] if k.startswith("model.")}
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved), saved
    assert len(saved) == 2 * 6 * 2  # A and B of 6 Linear layers in each of 2 blocks
    got = torch.load(tmp_path / f"{name}.pt", weights_only=True)
    want = _fit(str(tmp_path), "one", 6, base, {})
    assert set(got) == set(want)
    moved = 0
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6, msg=key)
        moved += ".lora_B." in key and bool(value.abs().sum() > 0)
    assert moved == 12  # every adapter trained
