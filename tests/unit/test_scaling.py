"""Scaling efficiency against the latest matching one-process run in the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.analyze.scaling import scaling_figures
from tandem.monitor.store import RunStore


def _run(store: RunStore, run_id: str, world: int, rate: float, script: str = "/x/train.py",
         batch: int = 128, status: str = "completed") -> None:
    config = {"train": {"global_batch": batch, "micro_batch": 0}, "precision": {"mode": "fp32"},
              "plan": {"device": "auto"}}
    store.start_run(run_id, run_id, config, {"world_size": world}, {"script": script})
    store.finish_run(run_id, status, {"samples_per_s": rate})


def test_efficiency_uses_the_matching_one_process_run(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "one-old", 1, 500.0)
        _run(store, "one", 1, 1000.0)
        _run(store, "one-other-script", 1, 10.0, script="/x/other.py")
        _run(store, "one-other-batch", 1, 10.0, batch=64)
        _run(store, "one-failed", 1, 10.0, status="failed")
        _run(store, "four", 4, 3000.0)
    figures = scaling_figures(path, "four", 3000.0, 4)
    assert figures["scaling_reference"] == "one"
    assert figures["scaling_efficiency"] == pytest.approx(3000.0 / (4 * 1000.0))
    assert figures["scaling_speedup"] == pytest.approx(3.0)


def test_no_reference_no_figures(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "two", 2, 100.0)
    assert scaling_figures(path, "two", 100.0, 2) == {}
    assert scaling_figures(path, "two", 100.0, 1) == {}
