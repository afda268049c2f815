"""The mistakes people make, each tried as a script would make it.

Every case runs `tandem.fit` the way a training script does (settings from its command
line) and asserts the one message printed (one line, naming what is wrong), the exit
status 2, and that nothing was written for the run, or that what an earlier run committed
is there unchanged, byte for byte.
"""

from __future__ import annotations

import fcntl
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task

RECIPE = {"train.steps": 6, "train.global_batch": 20, "monitor.progress": "off",
          "monitor.calibrate_at": 0, "run.name": "job"}


def task_with(**fields: object) -> tandem.Task:
    base = dict(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                train_data=toy_task.IndexedData, loss=toy_task.loss)
    return tandem.Task(**{**base, **fields})  # type: ignore[arg-type]


def run_script(tmp: Path, task: tandem.Task, *flags: str) -> tandem.RunResult:
    return tandem.fit(task, argv=["--run.dir", str(tmp), *flags], defaults=RECIPE)


def usage_error(tmp: Path, capsys: pytest.CaptureFixture[str], task: tandem.Task,
                *flags: str) -> str:
    """Run the script, expect exit status 2 and one line; return that line."""
    with pytest.raises(SystemExit) as stopped:
        run_script(tmp, task, *flags)
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("tandem: error:")]
    assert len(lines) == 1, err
    return lines[0]


def snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------ settings
SETTINGS = [
    (("--train.stepz", "5"), "unknown config key 'train.stepz'"),
    (("--train.steps", "-1"), "train.steps"),
    (("--train.global_batch", "0"), "train.global_batch"),
    (("--plan.strategy", "fast"), "plan.strategy: 'fast' is not allowed"),
    (("--checkpoint.async_save", "maybe"), "'maybe' is not a boolean"),
    (("--train.steps", "ten"), "train.steps: 'ten' is not an integer"),
    (("--train.micro_batch", "3"), "train.micro_batch: 3 must divide"),
    (("--train.global_batch", "400"), "larger than the training dataset"),
    (("--train.target", "accuracy>>0.9"), "is not a goal"),
    (("--run.resume", "sometimes"), "run.resume: 'sometimes' is not allowed"),
    (("--config", "/nonexistent/settings.toml"), "settings.toml"),
    (("--plan", "/nonexistent/plan.toml"), "plan.toml"),
    (("stray",), "unexpected argument 'stray'"),
    (("--plan.backend", "nccl"), "plan.backend: 'nccl' needs CUDA devices"),
    (("--plan.static_graph", "true", "--train.micro_batch", "5"),
     "plan.static_graph: true with 4 accumulation passes"),
]


@pytest.mark.parametrize(("flags", "says"), SETTINGS, ids=[f[0][0] + (f[0][1] if len(f[0]) > 1
                                                                       else "") for f in SETTINGS])
def test_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: tuple,
                      says: str) -> None:
    line = usage_error(tmp_path, capsys, toy_task.task(), *flags)
    assert says in line
    assert not (tmp_path / "job").exists()


def test_wrong_types_in_a_toml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text('[train]\nsteps = "ten"\n')
    line = usage_error(tmp_path, capsys, toy_task.task(), "--config", str(settings))
    assert "train.steps: 'ten' is not an integer" in line


def test_a_toml_syntax_error_names_the_file(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    settings = tmp_path / "settings.toml"
    settings.write_text("[train\nsteps = 5\n")
    assert str(settings) in usage_error(tmp_path, capsys, toy_task.task(), "--config",
                                        str(settings))


# ------------------------------------------------------------------ the task
class NoLength(Dataset):
    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(12)


class Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        yield torch.zeros(12), torch.zeros(3)


class RaisesOnZero(toy_task.IndexedData):
    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        if i == 0:
            raise KeyError("sample 0 is missing from the shard index")
        return super().__getitem__(i)


class Ragged(toy_task.IndexedData):
    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        x, y, j = super().__getitem__(i)
        return x[: 12 - (i % 2)], y, j


def _frozen() -> nn.Module:
    model = toy_task.make_model()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


TASKS: list[tuple[str, Callable[[], tandem.Task], str]] = [
    ("model returns None", lambda: task_with(model=lambda: None),
     "Task.model must return an nn.Module, got NoneType"),
    ("model without trainable parameters", lambda: task_with(model=_frozen),
     "with no trainable parameters"),
    ("optimizer returns None", lambda: task_with(optimizer=lambda params: None),
     "Task.optimizer must return a torch.optim.Optimizer"),
    ("per-sample loss", lambda: task_with(
        loss=lambda out, b: nn.functional.mse_loss(out, b[1], reduction="none").mean(1)),
     "Task.loss must return the mean over the batch as a scalar; it returned a tensor of "
     "shape [20]"),
    ("per-sample metric", lambda: task_with(
        metrics={"err": lambda out, b: (out - b[1]).abs().mean(1)}),
     "Task.metrics['err'] must return the mean over the batch as a scalar"),
    ("dict batch without forward", lambda: task_with(
        train_data=lambda: _DictData()), "has no 'input' key"),
    ("iterable dataset", lambda: task_with(train_data=Stream), "IterableDataset"),
    ("dataset without length", lambda: task_with(train_data=NoLength), "without a length"),
    ("empty dataset", lambda: task_with(
        train_data=lambda: TensorDataset(torch.zeros(0, 12), torch.zeros(0, 3))),
     "empty dataset"),
    ("dataset raises on a sample", lambda: task_with(train_data=RaisesOnZero),
     "reading sample 0 raised KeyError"),
    ("samples of unequal shapes", lambda: task_with(train_data=Ragged),
     "cannot be batched together"),
    ("loss raises", lambda: task_with(loss=lambda out, b: nn.functional.mse_loss(out, b[0])),
     "Task.loss raised"),
    ("forward raises", lambda: task_with(model=lambda: nn.Linear(5, 3)),
     "the model's forward on a training batch raised RuntimeError"),
    ("iterable eval data", lambda: task_with(eval_data=Stream),
     "Task.eval_data returned an IterableDataset"),
    ("target without eval data", lambda: task_with(), "the task has no eval_data"),
    ("unknown target metric", lambda: task_with(eval_data=toy_task.IndexedData),
     "train.target names 'acc'"),
]


class _DictData(toy_task.IndexedData):
    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        x, y, j = super().__getitem__(i)
        return {"features": x, "target": y}


@pytest.mark.parametrize(("case", "make", "says"), TASKS, ids=[t[0] for t in TASKS])
def test_task_mistakes(tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str,
                       make: Callable[[], tandem.Task], says: str) -> None:
    flags = ("--train.target", "acc>=0.9") if "target" in case else ()
    line = usage_error(tmp_path, capsys, make(), *flags)
    assert says in line
    assert not (tmp_path / "job").exists()  # nothing written for the run
    assert _stored_runs(tmp_path) == []  # a refused start is no run: the message says why


def _stored_runs(tmp_path: Path) -> list[dict]:
    if not (tmp_path / "tandem.db").exists():
        return []
    with RunStore(tmp_path / "tandem.db") as store:
        return store.runs()


def test_a_loss_without_gradient_is_named_at_the_first_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    constant = task_with(loss=lambda out, b: torch.tensor(1.0))
    line = usage_error(tmp_path, capsys, constant)
    assert "does not depend on the model's parameters" in line
    assert not list((tmp_path / "job" / "checkpoints").glob("step_*"))
    assert _stored_runs(tmp_path) == []  # refused at the first step: no run row either


# ------------------------------------------------------------------ the run directory
def test_a_run_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job").write_text("not a directory")
    assert "exists and is not a directory" in usage_error(tmp_path, capsys, toy_task.task())
    assert (tmp_path / "job").read_text() == "not a directory"


def test_a_checkpoint_dir_that_is_a_file(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "checkpoints").write_text("oops")
    line = usage_error(tmp_path, capsys, toy_task.task())
    assert "checkpoints" in line and "not a directory" in line
    assert (tmp_path / "job" / "checkpoints").read_text() == "oops"


def test_a_second_launch_is_refused_while_the_first_holds_the_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_script(tmp_path, toy_task.task())
    before = snapshot(tmp_path / "job")
    held = os.open(tmp_path / "job", os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as the first run holds it
    try:
        line = usage_error(tmp_path, capsys, toy_task.task(), "--train.steps", "9")
    finally:
        os.close(held)
    assert "is in use by" in line and "another --run.name" in line
    assert snapshot(tmp_path / "job") == before
    assert [r["status"] for r in _stored_runs(tmp_path)] == ["completed"]  # no refused row


def test_no_checkpoint_verifies_stops_and_fresh_sets_them_aside(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_script(tmp_path, toy_task.task(), "--checkpoint.every", "2", "--checkpoint.keep", "0")
    checkpoints = tmp_path / "job" / "checkpoints"
    for shard in checkpoints.glob("step_*/__0_0.distcp"):
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    before = snapshot(checkpoints)
    line = usage_error(tmp_path, capsys, toy_task.task(), "--train.steps", "9")
    assert "none verifies" in line and "--run.resume fresh" in line
    assert snapshot(checkpoints) == before  # nothing deleted, nothing written
    fresh = run_script(tmp_path, toy_task.task(), "--train.steps", "9", "--run.resume",
                       "fresh")
    assert fresh.summary["steps"] == 9
    aside = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith(".set-aside-"))
    assert aside == [".set-aside-step_000000002", ".set-aside-step_000000004",
                     ".set-aside-step_000000006"]


# ------------------------------------------------------------------ resuming
def test_a_new_global_batch_on_resume_needs_allow_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_script(tmp_path, toy_task.task())
    before = snapshot(tmp_path / "job")
    line = usage_error(tmp_path, capsys, toy_task.task(), "--train.steps", "9",
                       "--train.global_batch", "40")
    assert "train.global_batch: 20 -> 40" in line and "--run.allow_changes" in line
    assert snapshot(tmp_path / "job") == before
    (trained,) = _stored_runs(tmp_path)  # the refused resume added no failed row
    assert trained["status"] == "completed" and trained["summary"]["steps"] == 6
    done = run_script(tmp_path, toy_task.task(), "--train.steps", "9",
                      "--train.global_batch", "40", "--run.allow_changes",
                      "train.global_batch")
    assert done.summary["steps"] == 9 and done.summary["global_batch"] == 40


def test_extending_a_cosine_schedule_shows_the_lr_jump(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cosine = ("--optim.schedule", "warmup_cosine", "--optim.warmup_steps", "1")
    run_script(tmp_path, toy_task.task(), *cosine)
    line = usage_error(tmp_path, capsys, toy_task.task(), *cosine, "--train.steps", "30")
    assert "train.steps: 6 -> 30" in line
    old = 0.5 * (1 + math.cos(math.pi * 5 / 5))  # the multiplier at step 6 of 6 (floor 0)
    assert "lr multiplier at step 6" in line and f"{old:.4g} ->" in line


def test_another_optimizer_on_resume_needs_allow_changes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_script(tmp_path, toy_task.task())
    adam = task_with(optimizer=lambda params: torch.optim.Adam(params, lr=1e-3))
    line = usage_error(tmp_path, capsys, adam, "--train.steps", "9")
    assert "optimizer:" in line and "'SGD'" in line and "'Adam'" in line


def test_free_changes_resume_without_a_word(tmp_path: Path) -> None:
    run_script(tmp_path, toy_task.task())
    done = run_script(tmp_path, toy_task.task(), "--train.steps", "9", "--train.eval_every",
                      "3", "--checkpoint.every", "3", "--monitor.log_every", "3")
    assert done.summary["steps"] == 9


# ------------------------------------------------------------------ help
def test_help_shows_the_recipe_and_the_global_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        tandem.fit(toy_task.task(), argv=["--help"], defaults=RECIPE)
    assert stopped.value.code == 0
    out = capsys.readouterr().out
    assert "--config FILE" in out and "--plan FILE" in out
    assert "--train.steps (int, script's recipe 6)" in out
    assert "--train.eval_every (int, default 0)" in out
