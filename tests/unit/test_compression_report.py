"""`tandem compress`'s trade-off in the run's report and on the dashboard's run page: one
point per model at its measured latency and size, the adopted one ringed, the budget's
bound drawn at the original's metric less the budget."""

from __future__ import annotations

import re
from pathlib import Path

from tandem.analyze.report.compression import record, tradeoff_html
from tandem.analyze.report.run_report import render_html
from tandem.analyze.report.svg import HEIGHT, PAD_B, PAD_T
from tandem.dashboard import queries, view_run
from tandem.dashboard.reader import connect_readonly
from tandem.monitor.store import RunStore


def _figures(name: str, accuracy: float, size: int, ms: float) -> dict:
    return {"technique": name, "accuracy": accuracy, "seeds": [accuracy], "params": size // 4,
            "bytes": size, "latency_ms": {"batch_1": ms / 10, "batch_64": ms}}


RESULT = {
    "metric": "accuracy", "higher_is_better": True, "budget": 1.0,
    "budget_unit": "percentage points", "prefer": "size",
    "verdict": "prune-50% adopted: the smallest within the budget of 1",
    "chosen": _figures("prune-50%", 0.985, 2_000, 1.0),
    "original": _figures("original", 0.99, 8_000, 4.0),
    "candidates": [_figures("prune-50%", 0.985, 2_000, 1.0),
                   _figures("lowrank-25%", 0.95, 1_000, 0.5)],
    "rejected": [{"technique": "lowrank-25%", "why": "accuracy 0.95 is 4 worse than ..."}],
}


def _store(tmp_path: Path) -> Path:
    path = tmp_path / "tandem.db"
    with RunStore(path) as store:
        store.start_run("r1", "trained", {}, {}, {})
        store.log_trial("r1", "t1", {"train.micro_batch": 8}, "adopted", {"label": "tuned"})
        record(store, "r1", RESULT)
    return path


def test_the_report_draws_each_model_the_adopted_one_ringed_and_the_budget(
        tmp_path: Path) -> None:
    with RunStore(_store(tmp_path)) as store:
        page = render_html(store, "r1")
        trials = store.trials("r1")
    assert "<h2>Compression</h2>" in page
    part = tradeoff_html(trials)
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", part)
    assert len(charts) == 2  # against latency, against size
    for chart in charts:
        assert len(re.findall(r'<circle class="dot', chart)) == 3
        ringed = re.findall(r'<circle class="dot chosen"[^>]*><title>([^<]*)</title>', chart)
        assert ringed == ["prune-50%"]
    # The budget's bound, 0.99 - 1 point = 0.98, on the y scale the dots use: the three
    # accuracies 0.95 .. 0.99 padded by 8% of their span.
    lo, hi = 0.95 - 0.04 * 0.08, 0.99 + 0.04 * 0.08
    want = HEIGHT - PAD_B + (0.98 - lo) / (hi - lo) * (PAD_T - (HEIGHT - PAD_B))
    level = re.search(r'<line class="mark" [^>]*y1="([0-9.]+)"', charts[0])
    assert level and abs(float(level.group(1)) - want) < 0.06
    # The tuner's decisions are not mixed with the candidates.
    assert "Tuning decisions" in page and page.count("lowrank-25%") == part.count("lowrank-25%")


def test_the_dashboard_run_page_carries_it_and_the_tuner_page_does_not(
        tmp_path: Path) -> None:
    path = _store(tmp_path)
    with RunStore(path) as store:
        store.start_run("r2", "compressed only", {}, {}, {})
        record(store, "r2", RESULT)
    conn = connect_readonly(path)
    try:
        loaded = view_run.load(conn, {"run_id": "r1"})
        assert loaded["compression"] == tradeoff_html(queries.trials(conn, "r1"))
        assert loaded["compression"].count('<circle class="dot chosen"') == 2
        assert queries.tune_sessions(conn) == ["r1"]  # r2 holds only a compression
    finally:
        conn.close()


def test_a_run_never_compressed_has_no_panel(tmp_path: Path) -> None:
    path = tmp_path / "tandem.db"
    with RunStore(path) as store:
        store.start_run("r1", "trained", {}, {}, {})
        assert "Compression" not in render_html(store, "r1")
        assert tradeoff_html(store.trials("r1")) == ""
