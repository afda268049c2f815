"""Scaling figures only against a comparable one-process run of the same work."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.analyze.scaling.efficiency import scaling_figures
from tandem.monitor.store import RunStore

QUIET = (50.0, 100.0)  # host %, process %: 2 cores, one busy with the run: no foreign load
LOADED = (100.0, 50.0)  # the run got half a core on a host busy to the last core


def _run(store: RunStore, run_id: str, world: int, rate: float, script: str = "/x/train.py",
         batch: int = 128, status: str = "completed", steps: int = 700,
         load: tuple[float, float] | None = QUIET) -> None:
    config = {"train": {"global_batch": batch, "micro_batch": 0}, "precision": {"mode": "fp32"},
              "plan": {"device": "auto"}}
    store.start_run(run_id, run_id, config, {"world_size": world, "strategy": "single"},
                    {"script": script, "cpu_count": 2, "world_size": world})
    windows = range(steps // 5, steps + 1, steps // 5)
    rows = [(s, -1, "time/step", batch / rate, float(s)) for s in windows]
    if load is not None:
        rows += [(s, -1, name, value, float(s)) for s in windows
                 for name, value in zip(("sys/cpu_percent", "sys/process_cpu_percent"), load,
                                        strict=True)]
    store.log_metrics(run_id, rows)
    store.finish_run(run_id, status, {"samples_per_s": rate, "steps": steps})


def _rate(store: RunStore, run_id: str) -> float:
    return store.run(run_id)["summary"]["samples_per_s"]


def test_efficiency_uses_the_newest_comparable_one_process_run(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "one-old", 1, 500.0)
        _run(store, "one", 1, 1000.0)
        _run(store, "one-other-script", 1, 10.0, script="/x/other.py")
        _run(store, "one-other-batch", 1, 10.0, batch=64)
        _run(store, "one-failed", 1, 10.0, status="failed")
        _run(store, "four", 4, 3000.0)
        rates = _rate(store, "four"), _rate(store, "one")
    figures = scaling_figures(path, "four", 3000.0, 4, 700)
    assert figures["scaling_reference"] == "one"
    assert figures["scaling_speedup"] == pytest.approx(rates[0] / rates[1])
    assert figures["scaling_efficiency"] == pytest.approx(rates[0] / (4 * rates[1]))
    assert "scaling_note" not in figures


def test_a_short_reference_gives_no_figure_and_says_why(tmp_path: Path) -> None:
    """The 2-process run of 700 steps against a 20-step one-process run: no figure."""
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "e_t1", 1, 40.0, steps=20)
        _run(store, "two", 2, 500.0)
    figures = scaling_figures(path, "two", 500.0, 2, 700)
    assert "scaling_speedup" not in figures and "scaling_efficiency" not in figures
    assert "e_t1 ran 20 steps against this run's 700" in figures["scaling_note"]
    # within 2x either way it counts
    assert "scaling_speedup" in scaling_figures(path, "two", 500.0, 2, 39)


def test_a_loaded_reference_gives_no_figure_and_says_why(tmp_path: Path) -> None:
    """2 cores at 100% with the run at 50%: 3 foreign threads (the scaling model's
    reading), beyond the bound of 0.25 a core."""
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "busy", 1, 100.0, load=LOADED)
        _run(store, "two", 2, 570.0)
    figures = scaling_figures(path, "two", 570.0, 2, 700)
    assert "scaling_speedup" not in figures
    assert "busy ran beside 3.0 foreign CPU-bound threads" in figures["scaling_note"]


def test_a_reference_whose_load_is_unknown_gives_no_figure(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "blind", 1, 100.0, load=None)
        _run(store, "two", 2, 180.0)
    figures = scaling_figures(path, "two", 180.0, 2, 700)
    assert "scaling_speedup" not in figures
    assert "blind's foreign CPU load is not known" in figures["scaling_note"]


def test_an_older_comparable_run_is_taken_over_a_newer_short_one(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "full", 1, 1000.0)
        _run(store, "short", 1, 4000.0, steps=20)
        _run(store, "two", 2, 1800.0)
    figures = scaling_figures(path, "two", 1800.0, 2, 700)
    assert figures["scaling_reference"] == "full"
    assert figures["scaling_speedup"] == pytest.approx(1.8)


def test_no_reference_no_figures(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with RunStore(path) as store:
        _run(store, "two", 2, 100.0)
    assert "no completed one-process run" in scaling_figures(path, "two", 100.0, 2,
                                                             700)["scaling_note"]
    assert scaling_figures(path, "two", 100.0, 1, 700) == {}
