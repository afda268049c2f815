"""Fine-tuning in one process: `train.freeze` by name patterns and `run.init_from` a tandem
run, a checkpoint, a DCP directory or safetensors (under another library's names through
`Task.map_weights`), checked against the weights the source holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import tandem
from tandem.checkpoint import manifest
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


class OtherNet(nn.Module):
    """The toy model as another library names it, with a buffer the toy model lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = nn.Linear(12, 32), nn.Linear(32, 3)
        self.register_buffer("position_ids", torch.arange(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.hidden(x)))


def _from_other(key: str) -> str | None:
    """OtherNet's names -> the toy model's; its buffer is left out."""
    if key == "position_ids":
        return None
    layer, rest = key.split(".", 1)
    return {"hidden": "0", "out": "2"}[layer] + "." + rest


class OutputsAtStart(tandem.Component):
    """The model's outputs on a fixed batch when the run starts."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x, self.outputs = x, torch.empty(0)

    def setup(self, parts: tandem.components.RunParts) -> None:
        with torch.no_grad():
            self.outputs = parts.module(self.x)


def _mapped_task() -> tandem.Task:
    task = toy_task.task()
    return tandem.Task(model=task.model, optimizer=task.optimizer,
                       train_data=task.train_data, loss=task.loss, map_weights=_from_other)


def test_safetensors_of_another_library_give_identical_outputs(tmp_path: Path) -> None:
    torch.manual_seed(3)
    other = OtherNet()
    state = other.state_dict()
    x = torch.randn(16, 12)
    with torch.no_grad():
        expected = other(x)
    # one file, and two shards with an index as transformers writes them
    save_file(state, str(tmp_path / "model.safetensors"))
    folder = tmp_path / "sharded"
    folder.mkdir()
    shards = {"model-00001-of-00002.safetensors": ["hidden.weight", "hidden.bias"],
              "model-00002-of-00002.safetensors": ["out.weight", "out.bias", "position_ids"]}
    for file, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(folder / file))
    index = {"metadata": {"total_size": sum(v.numel() * v.element_size()
                                            for v in state.values())},
             "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for i, source in enumerate((tmp_path / "model.safetensors", folder)):
        seen = OutputsAtStart(x)
        _fit(tmp_path / f"run{i}", 1, [seen], task=_mapped_task(), run__init_from=str(source))
        assert torch.equal(seen.outputs, expected), source
    with pytest.raises(ValueError, match=r"missing keys: 0\.bias.*unexpected keys: hidden\.bias"):
        _fit(tmp_path / "unmapped", 1, run__init_from=str(folder))


def test_map_weights_must_name_one_key_per_name() -> None:
    from tandem.finetune.init_from import rename

    assert rename(["hidden.weight", "position_ids"], _from_other) == {
        "0.weight": "hidden.weight"}
    with pytest.raises(ValueError, match=r"map_weights\('a'\) returned 3: .*\(a str\)"):
        rename(["a"], lambda key: 3)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="maps both 'a' and 'b' to 'w'"):
        rename(["a", "b"], lambda key: "w")
    with pytest.raises(ValueError, match="Task.map_weights must be callable"):
        tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                    train_data=toy_task.IndexedData, loss=toy_task.loss, map_weights="0")


def test_init_from_a_dcp_directory_written_without_tandem(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(4)
    other, toy = OtherNet(), toy_task.make_model()
    # the state dict alone, under another library's names
    dcp.save(other.state_dict(), checkpoint_id=str(tmp_path / "alone"))
    # the model's state dict as the "model" entry beside other state
    dcp.save({"model": toy.state_dict(), "optim": {"scale": torch.ones(2)}},
             checkpoint_id=str(tmp_path / "nested"))
    x = torch.randn(16, 12)
    seen = OutputsAtStart(x)
    _fit(tmp_path / "a", 1, [seen], task=_mapped_task(), run__init_from=str(tmp_path / "alone"))
    with torch.no_grad():
        assert torch.equal(seen.outputs, other(x))
    start = Seen()
    _fit(tmp_path / "b", 1, [start], run__init_from=str(tmp_path / "nested"))
    for name, value in toy.state_dict().items():
        assert torch.equal(start.at_start[name], value), name


def test_a_source_that_is_not_weights_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no such file or directory"):
        _fit(tmp_path / "a", 1, run__init_from=str(tmp_path / "nope"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a tandem run directory"):
        _fit(tmp_path / "a", 1, run__init_from=str(tmp_path / "notes.txt"))


def test_lora_trains_only_adapters_and_merges_into_the_base_model(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from tandem.finetune.lora import LoRALinear, merged_state_dict, save_adapter

    base = _fit(tmp_path / "base", 4).model.state_dict()
    start = Seen()
    result = _fit(tmp_path / "lora", 6, [start], run__init_from=str(tmp_path / "base" / "toy"),
                  train__lora_rank=2, train__lora_alpha=4.0, train__lora_targets="2")
    model = result.model
    assert isinstance(model[2], LoRALinear) and type(model[0]) is nn.Linear
    # only the adapters reach the optimizer; the base weights never move
    assert [id(p) for p in start.optimized] == [id(model[2].lora_A.weight),
                                                id(model[2].lora_B.weight)]
    after = model.state_dict()
    for name, value in base.items():
        assert torch.equal(after[name], value), name
    assert not torch.equal(after["2.lora_B.weight"], torch.zeros(3, 2))
    # the merged weights in a plain model compute what the adapted model computes
    plain = toy_task.make_model()
    plain.load_state_dict(merged_state_dict(model))
    x = torch.randn(7, 12)
    torch.testing.assert_close(plain(x), model(x), rtol=1e-5, atol=1e-6)
    expected = base["2.weight"] + 2.0 * after["2.lora_B.weight"] @ after["2.lora_A.weight"]
    torch.testing.assert_close(plain[2].weight, expected)
    # PEFT's layout: names, config
    out = save_adapter(model, tmp_path / "adapter")
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert set(saved) == {"base_model.model.2.lora_A.weight", "base_model.model.2.lora_B.weight"}
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (2, 4.0, ["2"])


def test_lora_resumes_bit_exact(tmp_path: Path) -> None:
    whole = _fit(tmp_path / "whole", 6, train__lora_rank=2).model.state_dict()
    _fit(tmp_path / "parts", 3, train__lora_rank=2)
    resumed = _fit(tmp_path / "parts", 6, train__lora_rank=2).model.state_dict()
    for name, value in whole.items():
        assert torch.equal(resumed[name], value), name


def test_lora_refuses_what_it_cannot_adapt(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'9' matches no nn.Linear; .* 0, 2"):
        _fit(tmp_path / "a", 1, train__lora_rank=2, train__lora_targets="9")


def test_lora_from_a_base_checkpoints_the_adapters_only_and_resumes_bit_exact(
        tmp_path: Path) -> None:
    _fit(tmp_path / "base", 4)
    lora = {"run__init_from": str(tmp_path / "base" / "toy"), "train__lora_rank": 2}
    whole = _fit(tmp_path / "whole", 6, **lora).model.state_dict()
    _fit(tmp_path / "parts", 3, **lora)
    ckpt = next((tmp_path / "parts" / "toy" / "checkpoints").glob("step_*"))
    model_keys = {k for k in manifest.read(ckpt)["shapes"] if k.startswith("model.")}
    assert model_keys == {f"model.{i}.lora_{ab}.weight" for i in (0, 2) for ab in "AB"}
    resumed = _fit(tmp_path / "parts", 6, **lora).model.state_dict()
    for name, value in whole.items():
        assert torch.equal(resumed[name], value), name
