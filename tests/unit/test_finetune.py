"""Fine-tuning in one process: `train.freeze` by name patterns and `run.init_from` a tandem
run, a checkpoint or safetensors, checked against the weights the source holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import tandem
from tandem.finetune.freeze import frozen_names
from tests.dist import toy_task


class Seen(tandem.Component):
    """The weights the model holds when the run starts (after the built-in components)."""

    def __init__(self) -> None:
        self.at_start: dict[str, torch.Tensor] = {}

    def setup(self, parts: tandem.components.RunParts) -> None:
        self.at_start = {k: v.detach().clone() for k, v in parts.module.state_dict().items()}
        self.optimized = [p for g in parts.optimizer.param_groups for p in g["params"]]


def _fit(run_dir: Path, steps: int, components=(), task=None, **set_: object) -> tandem.Result:
    cfg = toy_task.config(str(run_dir), steps, 20, checkpoint={"at_end": True})
    for key, value in set_.items():
        section, name = key.split("__")
        setattr(getattr(cfg, section), name, value)
    return tandem.fit(task or toy_task.task(), config=cfg, components=list(components))


def test_a_pattern_that_freezes_nothing_or_everything_is_refused() -> None:
    model = toy_task.make_model()
    assert frozen_names(model, ["0.*"]) == ["0.weight", "0.bias"]
    with pytest.raises(ValueError, match=r"'9\.\*' matches no parameter.*0\.weight, 0\.bias"):
        frozen_names(model, ["9.*"])
    with pytest.raises(ValueError, match="freeze every parameter"):
        frozen_names(model, ["*"])


def test_frozen_weights_stay_and_stay_out_of_the_optimizer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    start = Seen()
    result = _fit(tmp_path, 6, [start], train__freeze="0.*")
    after = result.model.state_dict()
    for name in ("0.weight", "0.bias"):
        assert torch.equal(after[name], start.at_start[name]), name
    assert not torch.equal(after["2.weight"], start.at_start["2.weight"])
    # the optimizer holds the trainable parameters only
    module = result.model
    assert [id(p) for p in start.optimized] == [id(module[2].weight), id(module[2].bias)]


def test_init_from_a_run_directory_and_a_checkpoint(tmp_path: Path) -> None:
    trained = _fit(tmp_path / "a", 5).model.state_dict()
    start = Seen()
    _fit(tmp_path / "b", 1, [start], run__init_from=str(tmp_path / "a" / "toy"))
    for name, value in trained.items():
        assert torch.equal(start.at_start[name], value), name
    ckpt = next((tmp_path / "a" / "toy" / "checkpoints").glob("step_*"))
    start = Seen()
    _fit(tmp_path / "c", 1, [start], run__init_from=str(ckpt))
    assert torch.equal(start.at_start["2.weight"], trained["2.weight"])


def _wide_head_task() -> tandem.Task:
    """The toy model with a new head of 5 outputs (the source's has 3)."""
    task = toy_task.task()

    def model() -> nn.Module:
        return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 5))

    return tandem.Task(model=model, optimizer=task.optimizer, train_data=task.train_data,
                       loss=lambda out, batch: nn.functional.mse_loss(out[:, :3], batch[1]))


def test_init_from_safetensors_reports_what_does_not_fit(tmp_path: Path) -> None:
    trained = {k: v.contiguous() for k, v in _fit(tmp_path / "a", 3).model.state_dict().items()}
    file = tmp_path / "model.safetensors"
    save_file({**trained, "extra.weight": torch.zeros(2)}, str(file))
    with pytest.raises(ValueError) as err:
        _fit(tmp_path / "b", 1, task=_wide_head_task(), run__init_from=str(file))
    text = str(err.value)
    assert "unexpected keys: extra.weight" in text and "init_partial" in text
    assert "2.weight (source [3, 32], model [5, 32])" in text
    start = Seen()
    _fit(tmp_path / "c", 1, [start], task=_wide_head_task(), run__init_from=str(file),
         run__init_partial=True)
    assert torch.equal(start.at_start["0.weight"], trained["0.weight"])
    assert start.at_start["2.weight"].shape == (5, 32)  # the new head keeps its init
    # a folder of shards with an index
    folder = tmp_path / "sharded"
    folder.mkdir()
    shard = {k: "a.safetensors" if k.startswith("0.") else "b.safetensors" for k in trained}
    for name in ("a.safetensors", "b.safetensors"):
        save_file({k: v for k, v in trained.items() if shard[k] == name}, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shard}))
    start = Seen()
    _fit(tmp_path / "d", 1, [start], run__init_from=str(folder))
    for name, value in trained.items():
        assert torch.equal(start.at_start[name], value), name


def test_a_source_that_is_not_weights_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file or directory"):
        _fit(tmp_path / "a", 1, run__init_from=str(tmp_path / "nope"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a tandem run directory"):
        _fit(tmp_path / "a", 1, run__init_from=str(tmp_path / "notes.txt"))
