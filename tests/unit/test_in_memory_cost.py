"""Reading the data into memory is paid before the first step: the summary says what it
cost and what the whole process took, and a control experiment's figure says it counts
training steps only."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rich.console import Console

import tandem
from tandem.analyze.diagnosis.finding import Finding
from tandem.analyze.report.run_report import print_summary, validation_text
from tandem.monitor.store import RunStore
from tests.dist import toy_task

pytestmark = pytest.mark.timeout(120)

RECIPE = {"train.steps": 4, "train.global_batch": 20, "monitor.progress": "off",
          "monitor.calibrate_at": 0, "run.name": "job", "checkpoint.at_end": False}


class SlowData(toy_task.IndexedData):
    """Each item costs ~1 ms to read; the dataset counts the seconds its reads took."""

    read_s = 0.0

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        time.sleep(0.001)
        item = super().__getitem__(i)
        SlowData.read_s += time.perf_counter() - started
        return item


def _fit(tmp_path: Path, in_memory: bool) -> dict:
    SlowData.read_s = 0.0
    task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                       train_data=SlowData, loss=toy_task.loss)
    flags = ["--run.dir", str(tmp_path), "--data.in_memory", str(in_memory).lower(),
             "--monitor.store", str(tmp_path / "t.db")]
    return tandem.fit(task, argv=flags, defaults=RECIPE).summary


def test_the_summary_counts_the_up_front_load_and_the_whole_process(tmp_path: Path) -> None:
    summary = _fit(tmp_path, in_memory=True)
    # every sample was read once before training: at least the reads' own time
    assert summary["data_load_s"] >= SlowData.read_s > 0
    assert summary["startup_s"] >= summary["data_load_s"]
    assert summary["end_to_end_s"] >= summary["startup_s"] + summary["wall_time_s"] * 0.99
    with RunStore(tmp_path / "t.db") as store:
        console = Console(record=True, width=200)
        print_summary(store, "job", console)
    out = console.export_text()
    assert "end to end" in out and "data loading (in memory)" in out


def test_without_in_memory_no_load_figure(tmp_path: Path) -> None:
    summary = _fit(tmp_path, in_memory=False)
    assert "data_load_s" not in summary and summary["end_to_end_s"] > 0


def test_a_validated_gain_says_it_counts_training_steps_only() -> None:
    finding = Finding("input-bound", "high", {}, "data wait", [], predicted_speedup=2.5,
                      control="in_memory_data",
                      validation={"state": "confirmed", "predicted": 2.5, "measured": 3.12,
                                  "interval": [2.9, 3.3], "runs": 6})
    line = validation_text(finding)
    assert line.startswith("confirmed: predicted 2.50x, the control measured 3.12x")
    assert "not end to end" in line and "data loading" in line
