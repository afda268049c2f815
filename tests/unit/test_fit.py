"""One-process runs through tandem.fit: bad input stops early and clearly; precisions train."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task


def _fit(tmp_path: Path, task: tandem.Task | None = None, **sections: dict) -> tandem.RunResult:
    sections.setdefault("checkpoint", {"at_end": True})
    cfg = toy_task.config(str(tmp_path), 6, 20, **sections)
    return tandem.fit(task or toy_task.task(), config=cfg)


def _with(**fields: object) -> tandem.Task:
    base = dict(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                train_data=toy_task.IndexedData, loss=toy_task.loss)
    return tandem.Task(**{**base, **fields})  # type: ignore[arg-type]


def test_dataset_smaller_than_a_global_batch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="larger than the training dataset"):
        _fit(tmp_path, train={"global_batch": 400})


def test_empty_dataset(tmp_path: Path) -> None:
    empty = _with(train_data=lambda: TensorDataset(torch.zeros(0, 12), torch.zeros(0, 3)))
    with pytest.raises(ValueError, match="Task.train_data returned an empty dataset"):
        _fit(tmp_path, empty)


def test_micro_batch_that_does_not_divide(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train.micro_batch: 3 must divide"):
        _fit(tmp_path, train={"micro_batch": 3})


def test_unwritable_run_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="run.dir: cannot use .*Not a directory"):
        _fit(blocker)


def test_unknown_target_metric(tmp_path: Path) -> None:
    task = _with(eval_data=toy_task.IndexedData)
    with pytest.raises(ValueError, match="train.target names 'accuracy'"):
        _fit(tmp_path, task, train={"target": "accuracy>=0.5"})


def test_resume_never_refuses_to_overwrite(tmp_path: Path) -> None:
    _fit(tmp_path)
    before = sorted(p.name for p in (tmp_path / "toy" / "checkpoints").iterdir())
    with pytest.raises(ValueError, match="run.resume: 'never'"):
        _fit(tmp_path, run={"resume": "never"})
    assert sorted(p.name for p in (tmp_path / "toy" / "checkpoints").iterdir()) == before


def test_checkpoint_of_another_model_names_the_keys(tmp_path: Path) -> None:
    _fit(tmp_path)
    wider = _with(model=lambda: nn.Sequential(nn.Linear(12, 64), nn.Tanh(), nn.Linear(64, 3)))
    with pytest.raises(ValueError, match=r"0\.weight"):
        _fit(tmp_path, wider, train={"steps": 8})


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_finished_run_rerun_changes_nothing_on_disk(tmp_path: Path) -> None:
    first = _fit(tmp_path)
    before = _files(tmp_path)
    again = _fit(tmp_path)
    assert again.summary == first.summary and again.summary["steps"] == 6
    for a, b in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert _files(tmp_path) == before  # not a byte, not a timestamp, store included
    with RunStore(tmp_path / "tandem.db") as store:
        assert store.run("toy")["status"] == "completed"
    assert len(store_runs(tmp_path)) == 1


def test_a_longer_rerun_continues_the_same_record(tmp_path: Path) -> None:
    _fit(tmp_path)
    longer = _fit(tmp_path, train={"steps": 9})
    assert longer.summary["steps"] == 9
    with RunStore(tmp_path / "tandem.db") as store:
        run = store.run("toy")
        kinds = [e["kind"] for e in store.events(run["run_id"])]
    assert "resume" in kinds and run["status"] == "completed"
    assert len(store_runs(tmp_path)) == 1  # a resume continues the same record


def test_a_resumed_run_calibrates_again(tmp_path: Path) -> None:
    # The FLOP count and the peak come from calibration, 2 steps into each segment:
    # the resumed segment (steps 7-12) must carry them too (it once had none: the
    # calibration step counted from step 0, which a resumed run never passes again).
    monitor = {"calibrate_at": 2, "log_every": 2}
    _fit(tmp_path, monitor=monitor)
    _fit(tmp_path, train={"steps": 12}, monitor=monitor)
    with RunStore(tmp_path / "tandem.db") as store:
        run_id = store.runs()[0]["run_id"]
        steps = [m["step"] for m in store.metrics(run_id, name="flops/per_rank_step")]
    assert {s for s in steps if s <= 6} == {2, 4, 6}
    assert {s for s in steps if s > 6} == {8, 10, 12}


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path: Path, mode: str) -> None:
    task = _with(eval_data=toy_task.IndexedData)
    fp32 = _fit(tmp_path / "fp32", task, train={"steps": 30})
    low = _fit(tmp_path / mode, task, train={"steps": 30}, precision={"mode": mode})
    start = toy_task.reference(0, 20)[0]
    x, y = toy_task.IndexedData().x, toy_task.IndexedData().y
    with torch.no_grad():
        initial = nn.functional.mse_loss(start(x), y).item()
    assert low.summary["eval_loss"] < 0.9 * initial
    assert low.summary["eval_loss"] == pytest.approx(fp32.summary["eval_loss"], rel=0.05)


def store_runs(run_dir: Path) -> list[dict]:
    with RunStore(run_dir / "tandem.db") as store:
        return store.runs()


def test_the_run_store_holds_the_windows_and_evaluations(tmp_path: Path) -> None:
    task = _with(eval_data=toy_task.IndexedData)
    result = _fit(tmp_path, task, train={"steps": 20, "eval_every": 10},
                  monitor={"log_every": 5})
    with RunStore(tmp_path / "tandem.db") as store:
        run_id = store.runs()[0]["run_id"]
        loss = store.metrics(run_id, name="loss", rank=-1)
        evals = store.metrics(run_id, name="eval_loss")
        per_rank = store.metrics(run_id, name="time/step", rank=0)
    assert [m["step"] for m in loss] == [5, 10, 15, 20]
    assert [m["step"] for m in evals] == [10, 20]
    assert evals[-1]["value"] == pytest.approx(result.summary["eval_loss"])
    assert len(per_rank) == 4 and all(m["value"] > 0 for m in per_rank)
    p50, p95 = result.summary["step_time_p50_s"], result.summary["step_time_p95_s"]
    assert 0 < p50 <= p95


def test_tensorboard_sink_receives_the_windows(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _fit(tmp_path, train={"steps": 10}, monitor={"log_every": 5, "tensorboard": "tb"})
    events = EventAccumulator(str(tmp_path / "toy" / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [5, 10]


def test_objects_frozen_while_training_and_released_after(tmp_path: Path) -> None:
    import gc

    seen: list[int] = []

    def loss(out: torch.Tensor, batch: object) -> torch.Tensor:
        seen.append(gc.get_freeze_count())
        return toy_task.loss(out, batch)

    before = gc.get_freeze_count()
    _fit(tmp_path, _with(loss=loss))
    # torch's import alone leaves far more than 10k objects: all frozen for the training
    # steps (the first call is the preflight's check of the task, before training)
    assert len(seen) > 6 and min(seen[-6:]) > before + 10_000, (before, seen)
    assert gc.get_freeze_count() == before == 0  # fit(config=...) gives them back
    with pytest.raises(ValueError, match="train.micro_batch"):
        _fit(tmp_path / "bad", train={"micro_batch": 3})
    assert gc.get_freeze_count() == 0  # and on a failure too
