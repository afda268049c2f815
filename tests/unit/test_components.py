"""Run components defined here, in the test, and nowhere in tandem: one freezes parameters
by a name pattern, one adds a term to the loss and keeps a state. Trained, saved, resumed
and rolled back through the state list the trainer derives from its components."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import tandem
from tandem.checkpoint import read_meta
from tandem.runtime import derive_seed
from tests.dist import toy_task

LAM = 0.01


class Freeze(tandem.Component):
    """Parameters whose names match `pattern` are not trained."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        for name, p in model.named_parameters():
            if fnmatch.fnmatch(name, self.pattern):
                p.requires_grad_(False)
        return model


class Counter(tandem.Component):
    """Counts optimizer steps the run has passed; a rollback keeps the count."""

    name = "counter"
    rolls_back = False

    def __init__(self) -> None:
        self.steps = 0

    def after_step(self, step: int, skipped: bool) -> None:
        self.steps += 1

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])


class WeightPenalty(Counter):
    """loss + LAM * (1 + steps / 10) * sum of the squared trainable weights: the
    coefficient depends on the component's own state, so a resume that lost it would
    train other weights; a rollback restores it."""

    name = "penalty"
    rolls_back = True

    def __init__(self) -> None:
        super().__init__()
        self.params: list[nn.Parameter] = []

    def setup(self, parts: tandem.components.RunParts) -> None:
        self.params = [p for p in parts.module.parameters() if p.requires_grad]

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        return loss + penalty(self.params, self.steps)


def penalty(params: list[nn.Parameter], steps: int) -> torch.Tensor:
    return LAM * (1 + steps / 10) * sum(p.pow(2).sum() for p in params)


def reference(steps: int, global_batch: int, seed: int = 7) -> nn.Module:
    """Plain PyTorch: the first layer frozen, the same extra term, full-batch steps."""
    torch.manual_seed(derive_seed("build", seed))
    data = toy_task.IndexedData()
    model = toy_task.make_model()
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith("0."))
    opt = toy_task.make_optimizer(model.parameters())
    trained = [p for p in model.parameters() if p.requires_grad]
    for step, ids in enumerate(toy_task.global_batches(steps, global_batch, seed)):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(data.x[ids]), data.y[ids])
        (loss + penalty(trained, step)).backward()
        opt.step()
    return model


def _fit(run_dir: Path, steps: int, components: list[tandem.Component],
         **sections: dict) -> tandem.RunResult:
    sections.setdefault("checkpoint", {"at_end": True})
    cfg = toy_task.config(str(run_dir), steps, 20, micro_batch=10, **sections)
    return tandem.fit(toy_task.task(), config=cfg, components=components)


def test_frozen_layer_and_loss_term_match_plain_pytorch(tmp_path: Path) -> None:
    result = _fit(tmp_path, 8, [Freeze("0.*"), WeightPenalty()])
    assert result.model is not None
    expected = reference(8, 20)
    for (name, got), want in zip(result.model.state_dict().items(),
                                 expected.state_dict().values(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    torch.manual_seed(derive_seed("build", 7))
    initial = toy_task.make_model()  # the weights the run started from
    assert torch.equal(result.model[0].weight, initial[0].weight)  # frozen: untouched
    assert not torch.equal(result.model[2].weight, initial[2].weight)


def test_the_term_changes_training(tmp_path: Path) -> None:
    """The comparison above can fail: without the term the weights are elsewhere."""
    plain = _fit(tmp_path / "plain", 8, [Freeze("0.*")])
    with_term = reference(8, 20)
    assert plain.model is not None
    assert not torch.allclose(plain.model[2].weight, with_term[2].weight, atol=1e-4)


def _weights(result: tandem.RunResult) -> dict[str, torch.Tensor]:
    assert result.model is not None
    return {k: v.clone() for k, v in result.model.state_dict().items()}


def test_resume_is_bit_exact_with_the_components_state(tmp_path: Path) -> None:
    whole = _weights(_fit(tmp_path / "whole", 8, [Freeze("0.*"), WeightPenalty()]))
    _fit(tmp_path / "parts", 4, [Freeze("0.*"), WeightPenalty()])
    saved = read_meta(tmp_path / "parts" / "toy" / "checkpoints" / f"step_{4:09d}")
    assert "penalty" in saved["states"] and "counter" not in saved["states"]
    term = WeightPenalty()
    resumed = _weights(_fit(tmp_path / "parts", 8, [Freeze("0.*"), term]))
    assert term.steps == 8  # 4 restored + 4 trained
    for name, value in whole.items():
        assert torch.equal(value, resumed[name]), name


def test_task_components_factory_is_used(tmp_path: Path) -> None:
    made: list[WeightPenalty] = []

    def components() -> list[tandem.Component]:
        made.append(WeightPenalty())
        return [Freeze("0.*"), made[-1]]

    task = toy_task.task()
    task.components = components
    cfg = toy_task.config(str(tmp_path), 8, 20, micro_batch=10)
    result = tandem.fit(task, config=cfg)
    assert len(made) == 1 and made[0].steps == 8
    assert result.model is not None
    torch.testing.assert_close(result.model[2].weight, reference(8, 20)[2].weight,
                               rtol=1e-5, atol=1e-6)


def test_rollback_restores_the_states_that_roll_back_and_keeps_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A NaN loss at step 6: the update is skipped and the run goes back to step 4.
    monkeypatch.setenv("TANDEM_FAULTS", json.dumps([{"step": 6, "kind": "nan"}]))
    term, counter = WeightPenalty(), Counter()
    _fit(tmp_path, 8, [Freeze("0.*"), term, counter],
         fault={"nonfinite": "rollback"}, checkpoint={"every": 4, "at_end": True},
         monitor={"log_every": 2})
    # Steps 0-6 passed (7), back to 4, then 4-7 again (4 more).
    assert counter.steps == 11
    assert term.steps == 8


def test_a_repeated_state_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'penalty'"):
        _fit(tmp_path, 4, [WeightPenalty(), WeightPenalty()])


def test_a_non_component_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a tandem.Component"):
        _fit(tmp_path, 4, [object()])  # type: ignore[list-item]
