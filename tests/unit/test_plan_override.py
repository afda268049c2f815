"""A flag that overrides a value of the plan file wins, and says so, naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.fit import config_from_argv

PLAN = "[train]\nmicro_batch = 64\n\n[plan]\nstrategy = \"ddp\"\nbucket_mb = 25.0\n"


@pytest.fixture
def plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("TANDEM_PLAN", raising=False)
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    return path


def test_a_flag_over_the_plan_wins_and_is_named(plan: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = config_from_argv(["--plan", str(plan), "--train.micro_batch", "4",
                               "--plan.bucket_mb", "25", "--train.steps", "7"],
                              {"train.global_batch": 128})
    assert config.train.micro_batch == 4 and config.train.steps == 7
    assert config.plan.strategy == "ddp"
    warned = capsys.readouterr().err.splitlines()
    # micro_batch differs from the plan's; bucket_mb is the plan's own value; steps is
    # not in the plan: only the first is an override.
    assert len(warned) == 1, warned
    assert "--train.micro_batch 4" in warned[0] and "train.micro_batch = 64" in warned[0]


def test_the_plan_from_tandem_run_is_checked_too(plan: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TANDEM_PLAN", str(plan))  # what `tandem run --plan FILE` sets
    config = config_from_argv(["--plan.strategy", "fsdp"])
    assert config.plan.strategy == "fsdp" and config.train.micro_batch == 64
    warned = capsys.readouterr().err
    assert "--plan.strategy 'fsdp' overrides the plan file's plan.strategy = 'ddp'" in warned


def test_other_ranks_stay_quiet(plan: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "1")
    config_from_argv(["--plan", str(plan), "--train.micro_batch", "4"])
    assert capsys.readouterr().err == ""
