from pathlib import Path

import pytest

from tandem import config


def test_defaults_validate_and_round_trip_through_toml(tmp_path: Path) -> None:
    cfg = config.load(overrides={"train.steps": "7", "plan.bucket_mb": "4.5",
                                 "data.pin_memory": "false", "train.target": "accuracy>=0.9"})
    assert (cfg.train.steps, cfg.plan.bucket_mb, cfg.data.pin_memory) == (7, 4.5, False)
    path = tmp_path / "c.toml"
    path.write_text(cfg.to_toml())
    assert config.load(path) == cfg


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("train.stepz", "1", "unknown config key 'train.stepz'"),
    ("nope.steps", "1", "sections ['run', 'train'"),
    ("plan.strategy", "zero9", "choose one of ['auto', 'single', 'ddp', 'fsdp', 'localsgd'"),
    ("train.steps", "0", "train.steps: 0 is out of range"),
    ("train.steps", "1.5", "train.steps: '1.5' is not an integer"),
    ("data.pin_memory", "maybe", "not a boolean"),
    ("train.target", "accuracy>0.9", "train.target"),
    ("optim.lr_scaling", "linear", "optim.reference_batch"),
    ("precision.attention", "bf16", "choose one of ['auto', 'fp32', 'autocast']"),
])
def test_bad_values_name_the_field_and_what_is_allowed(key: str, value: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        config.load(overrides={key: value})
    assert needle in str(err.value)


def test_toml_file_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        config.load(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nsteps = 'ten'\n")
    with pytest.raises(ValueError, match="train.steps: 'ten' is not an integer"):
        config.load(bad)
    bad.write_text("[train\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        config.load(bad)


def test_argv_parsing() -> None:
    args = config.parse_args(["--config", "a.toml", "--train.steps", "5", "--plan.strategy=ddp",
                              "--plan", "p.toml"])
    assert args.config == "a.toml" and args.plan == "p.toml"
    assert args.overrides == {"train.steps": "5", "plan.strategy": "ddp"}
    assert not args.help
    assert config.parse_args(["--help"]).help
    with pytest.raises(ValueError, match="needs a value"):
        config.parse_args(["--train.steps"])
    with pytest.raises(ValueError, match="unexpected argument"):
        config.parse_args(["steps"])


def test_reference_lists_every_field() -> None:
    text = config.reference()
    for section, kind in config.sections().items():
        for name in kind.__dataclass_fields__:
            assert f"--{section}.{name} " in text


def test_plan_file_layers_between_config_file_and_overrides(tmp_path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text("[train]\nsteps = 7\nglobal_batch = 64\n[plan]\nbucket_mb = 1.0\n")
    plan = tmp_path / "plan.toml"
    plan.write_text("[plan]\nbucket_mb = 50.0\ncomm_hook = \"fp16\"\n")
    c = config.load(cfg, {"plan.comm_hook": "none"}, {"train.steps": 3}, plan)
    assert (c.train.steps, c.train.global_batch) == (7, 64)
    assert c.plan.bucket_mb == 50.0 and c.plan.comm_hook == "none"
    with pytest.raises(ValueError, match="plan file .* does not exist"):
        config.load(plan=tmp_path / "missing.toml")
