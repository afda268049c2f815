"""A mixture's figures on the Run page: each task's losses in one chart, its evaluation
metrics in another, each line labelled by its source (real Chromium via Playwright)."""

from __future__ import annotations

import time
from pathlib import Path

from tandem.monitor.store import RunStore
from tests.dashboard.conftest import open_page

CHART = """id => { const c = tandem.charts[id]; if (!c) return null;
  return {lines: c.lines.map((l, i) => ({label: l.label, shown: l.shown,
          y: c.u.data[i + 1].filter(v => v !== null)}))}; }"""


def test_run_page_draws_each_tasks_curves(tmp_path: Path, serve, page) -> None:
    now = time.time()
    curves = {"task/digit/loss": [2.0, 1.0, 0.5], "task/parity/loss": [0.7, 0.6, 0.5],
              "task/digit/eval_loss": [1.5, 0.8, 0.4], "task/digit/accuracy": [0.5, 0.8, 0.9],
              "task/parity/accuracy": [0.6, 0.7, 0.8], "task/digit/share": [0.5, 0.5, 0.5],
              "loss": [1.4, 0.8, 0.5]}
    with RunStore(tmp_path / "runs.db") as store:
        store.start_run("mix-1", "mix", {"train": {"steps": 30}}, {"strategy": "single"},
                        {"world_size": 1, "device": "cpu"})
        store.log_metrics("mix-1", [(10 * (i + 1), -1, name, v, now)
                                    for name, values in curves.items()
                                    for i, v in enumerate(values)])
        store.finish_run("mix-1", "completed", {})
    open_page(page, serve(tmp_path / "runs.db").url("/run/mix-1", local=True))
    losses, metrics = page.evaluate(CHART, "task-loss"), page.evaluate(CHART, "task-metrics")
    assert {ln["label"]: ln["y"] for ln in losses["lines"]} == {
        n: v for n, v in curves.items() if n.endswith("loss") and n.startswith("task/")}
    assert {ln["label"]: ln["y"] for ln in metrics["lines"]} == {
        n: curves[n] for n in ("task/digit/accuracy", "task/parity/accuracy")}
    assert {ln["shown"] for ln in metrics["lines"]} == {"digit accuracy", "parity accuracy"}
    assert "digit evaluation loss" in {ln["shown"] for ln in losses["lines"]}
