"""PEFT both ways, with peft itself: a user's `peft.PeftModel` as the task's model (its
adapters train, checkpoints hold them alone and resume bit-exact, the export loads with
`PeftModel.from_pretrained` and merges), and tandem's own LoRA exported in PEFT's format
and loaded by `PeftModel.from_pretrained` onto the same base."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

import tandem
from tandem.checkpoint import manifest
from tandem.finetune.lora import LoRA, merged_state_dict, peft_targets, save_adapter
from tests.dist import toy_task

ADAPTERS = {f"base_model.model.{i}.lora_{ab}.default.weight" for i in (0, 2) for ab in "AB"}


def peft_model() -> nn.Module:
    """The toy model with PEFT's LoRA adapters (rank 2) on both Linear layers."""
    return get_peft_model(toy_task.make_model(),
                          LoraConfig(r=2, lora_alpha=4, target_modules=["0", "2"]))


def peft_task() -> tandem.Task:
    task = toy_task.task()
    return tandem.Task(model=peft_model, optimizer=task.optimizer,
                       train_data=task.train_data, loss=task.loss)


class Optimized(tandem.Component):
    """The names of the parameters the optimizer holds, and the weights at the start."""

    def setup(self, parts: tandem.components.RunParts) -> None:
        ids = {id(p) for g in parts.optimizer.param_groups for p in g["params"]}
        self.names = {n for n, p in parts.module.named_parameters() if id(p) in ids}
        self.at_start = {k: v.clone() for k, v in parts.module.state_dict().items()}


def _fit(run_dir: Path, steps: int, task: tandem.Task, components=(), **train: object
         ) -> tandem.Result:
    cfg = toy_task.config(str(run_dir), steps, 20, train=train,
                          checkpoint={"every": 3, "async_save": False})
    return tandem.fit(task, config=cfg, components=list(components))


def _base_of(peft_state: dict[str, torch.Tensor]) -> nn.Module:
    """A plain toy model holding a PeftModel's base weights."""
    base = toy_task.make_model()
    base.load_state_dict({k.removeprefix("base_model.model.").replace(".base_layer", ""): v
                          for k, v in peft_state.items() if ".lora_" not in k})
    return base


def test_a_peft_model_trains_its_adapters_checkpoints_them_alone_and_resumes_exactly(
        tmp_path: Path) -> None:
    seen = Optimized()
    whole = _fit(tmp_path / "whole", 6, peft_task(), [seen]).model
    assert isinstance(whole, PeftModel)
    assert seen.names == ADAPTERS  # PEFT's adapters, no adapters of tandem's on top
    state = whole.state_dict()
    for name, value in seen.at_start.items():
        if ".lora_" not in name:
            assert torch.equal(state[name], value), name  # the base never moves
    assert not torch.equal(state["base_model.model.2.lora_B.default.weight"],
                           seen.at_start["base_model.model.2.lora_B.default.weight"])
    _fit(tmp_path / "parts", 3, peft_task())
    ckpt = next((tmp_path / "parts" / "toy" / "checkpoints").glob("step_*"))
    assert {k.removeprefix("model.") for k in manifest.read(ckpt)["shapes"]
            if k.startswith("model.")} == ADAPTERS
    resumed = _fit(tmp_path / "parts", 6, peft_task()).model.state_dict()
    for name, value in state.items():
        assert torch.equal(resumed[name], value), name
    # PEFT's files, loaded by PEFT onto the base; and merged into the plain model
    out = save_adapter(whole, tmp_path / "adapter")
    assert {p.name for p in out.iterdir()} >= {"adapter_model.safetensors",
                                               "adapter_config.json"}
    loaded = PeftModel.from_pretrained(_base_of(state), str(out))
    plain = toy_task.make_model()
    plain.load_state_dict(merged_state_dict(whole))
    x = torch.randn(9, 12)
    with torch.no_grad():
        expected = whole(x)
        torch.testing.assert_close(loaded(x), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(plain(x), expected, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(_base_of(state)(x), expected)  # the adapters matter


def test_lora_rank_on_a_peft_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.lora_rank 2: the model is a peft.PeftModel"):
        _fit(tmp_path, 1, peft_task(), lora_rank=2)


def test_tandems_lora_export_loads_into_peft_with_the_same_outputs(tmp_path: Path) -> None:
    base = _fit(tmp_path / "base", 3, toy_task.task()).model.state_dict()
    cfg = toy_task.config(str(tmp_path / "lora"), 6, 20, run={"init_from": str(
        tmp_path / "base" / "toy")}, train={"lora_rank": 2, "lora_alpha": 4.0})
    adapted = tandem.fit(toy_task.task(), config=cfg).model
    out = save_adapter(adapted, tmp_path / "adapter")
    plain = toy_task.make_model()
    plain.load_state_dict(base)
    x = torch.randn(9, 12)
    with torch.no_grad():
        before = plain(x)
        loaded = PeftModel.from_pretrained(plain, str(out))
        torch.testing.assert_close(loaded(x), adapted(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(before, adapted(x))  # the adapters matter


def test_peft_target_names_select_only_the_adapted_layers(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Linear(4, 4))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoRA(2, 4.0, ["1"])  # the outer Linear "1", not the inner "0.1"
    lora.transform_model(model, torch.device("cpu"))
    nn.init.normal_(model[1].lora_B.weight)
    assert peft_targets(model, ["1"]) == "(?:1)"  # PEFT's suffix rule would take 0.1 too
    out = save_adapter(model, tmp_path / "a")
    plain = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), nn.Linear(4, 4))
    plain.load_state_dict(base)
    loaded = PeftModel.from_pretrained(plain, str(out))
    adapted = [n for n, _ in loaded.named_modules() if n.endswith(".lora_A")]
    assert adapted == ["base_model.model.1.lora_A"]
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-6)
