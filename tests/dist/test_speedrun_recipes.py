"""The examples' speedrun recipes run unchanged at 1 and 4 processes and under FSDP (a few
steps each): every trick of the recipe (Muon, weight averaging, in-memory batches, the
sequence ramp, late evaluations) on each layout; the averaged weights agree between
layouts."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset

import tandem
from tandem.config import load
from tests.dist.procs import run_ranks

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT = {"mnist1d_cnn": {"train.steps": 4, "train.eval_from": 4, "train.eval_every": 2},
         "char_lm": {"train.steps": 3, "train.eval_from": 3, "train.eval_every": 3,
                     "train.seq_ramp": "0:32,2:0"}}
# The first evaluation samples kept: the whole split would be most of the test (a char_lm
# sample is a full-length sequence, in bf16, which a CPU without native bf16 emulates).
EVAL_SAMPLES = {"mnist1d_cnn": 128, "char_lm": 32}
# Seconds each layout may take, sized for a 2-core AVX2-only host (about 5x slower than
# an AMX one, and 4 ranks share its 2 cores); run_ranks kills the ranks when they are up.
LAYOUT_TIMEOUT_S = 280


def example(name: str):
    pytest.importorskip("mnist1d", reason="the MNIST-1D example needs the mnist1d package")
    sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recipes(rank: int, world: int, out: str, strategy: str) -> None:
    for name, short in SHORT.items():
        module = example(name)
        full, kept = module.task.eval_data, range(EVAL_SAMPLES[name])
        task = dataclasses.replace(module.task, eval_data=lambda f=full: Subset(f(), kept))
        cfg = load(overrides={**module.RECIPE, **short, "run.dir": out, "run.name": name,
                              "plan.strategy": strategy, "monitor.progress": "off",
                              "monitor.report": False, "checkpoint.every": 0})
        result = tandem.fit(task, config=cfg)
        if rank == 0:
            first = next(iter(result.model.state_dict().values()))
            Path(out, f"{name}.json").write_text(json.dumps({
                "summary": result.summary, "first": first.flatten()[:8].tolist(),
                "ema": cfg.train.ema_decay, "memory": cfg.data.in_memory}))


@pytest.mark.timeout(3 * LAYOUT_TIMEOUT_S + 30)
def test_recipes_run_at_one_and_four_processes_and_under_fsdp(tmp_path: Path) -> None:
    layouts = {"one": (1, "auto"), "fsdp": (2, "fsdp"), "four": (4, "ddp")}
    for tag, (world, strategy) in layouts.items():
        run_ranks(_recipes, world, str(tmp_path / tag), strategy, timeout=LAYOUT_TIMEOUT_S)
    for name in SHORT:
        got = {tag: json.loads((tmp_path / tag / f"{name}.json").read_text())
               for tag in layouts}
        for tag, (world, _) in layouts.items():
            summary = got[tag]["summary"]
            assert summary["world_size"] == world and summary["steps"] == SHORT[name][
                "train.steps"]
            assert "eval_loss" in summary and summary["eval_loss"] == summary["eval_loss"]
        # Same math at every layout: the returned (averaged) weights agree.
        for tag in ("fsdp", "four"):
            torch.testing.assert_close(torch.tensor(got[tag]["first"]),
                                       torch.tensor(got["one"]["first"]), rtol=2e-3, atol=2e-4)
