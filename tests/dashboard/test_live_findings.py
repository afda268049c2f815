"""A live run's diagnosis on the dashboard reads its latest windows, not its whole history:
what the run does now, at a cost that does not grow with it; once the run ends, every row."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from tandem.analyze.diagnosis.diagnose import diagnose
from tandem.analyze.synthetic import Synthetic, synthetic_rows
from tandem.dashboard import view_run
from tandem.monitor.store import RunStore


def _dicts(rows: list[tuple]) -> list[dict]:
    return [{"step": r[0], "rank": r[1], "name": r[2], "value": r[3], "time": r[4]}
            for r in rows]


def _found(store: Path) -> dict:
    conn = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    try:
        return view_run.findings(conn, {"run_id": "live-1"})
    finally:
        conn.close()


@pytest.mark.parametrize("straggler", [1, None], ids=["straggler-now", "placebo"])
def test_a_long_live_run_is_diagnosed_on_its_latest_windows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, straggler: int | None) -> None:
    # 60 even windows, then 20 in which rank 1 takes 1.5x as long: a straggler now, in a
    # quarter of the run's windows (the whole-run rule wants more than half). The placebo:
    # the same 20 windows with no straggler, where the latest rows must name none.
    early = synthetic_rows(Synthetic(steps=600, world_size=2, seed=1), start=1e9)
    late = [(step + 600, rank, name, value, t + 60)
            for step, rank, name, value, t in synthetic_rows(
                Synthetic(steps=200, world_size=2, straggler=straggler, straggler_factor=1.5,
                          seed=2),
                start=early[-1][4])]
    monkeypatch.setattr(view_run, "LIVE_ROWS", len(late) + 5)  # 5 rows of step 600 too
    config = {"train": {"steps": 800}}
    store = tmp_path / "tandem.db"
    with RunStore(store) as s:
        s.start_run("live-1", "live", config, {"strategy": "ddp"}, {"world_size": 2})
        s.log_metrics("live-1", early)
        s.log_metrics("live-1", late)

    live = _found(store)
    now = diagnose(_dicts(late), [], config=config)  # the cut window (step 600) left out
    whole = diagnose(_dicts(early + late), [], config=config)
    assert live["latest"] == [610, 800] and live["rows"] == len(late)
    assert [f["kind"] for f in live["findings"]] == [f.kind for f in now]
    assert [f["message"] for f in live["findings"]] == [f.message for f in now]
    assert "straggler" not in [f.kind for f in whole]
    named = [f for f in live["findings"] if f["kind"] == "straggler"]
    if straggler is None:
        assert not named
    else:
        assert [f["evidence"]["rank"] for f in named] == [straggler]

    with RunStore(store) as s:
        s.finish_run("live-1", "completed", {"steps": 800})
    ended = _found(store)
    assert ended["latest"] is None and ended["rows"] == len(early) + len(late)
    assert [f["kind"] for f in ended["findings"]] == [f.kind for f in whole]
    assert ended["findings"] == [view_run.shape.jsonable(dataclasses.asdict(f)) for f in whole]


def test_a_short_live_run_is_diagnosed_on_every_row(tmp_path: Path) -> None:
    rows = synthetic_rows(Synthetic(steps=300, world_size=2, straggler=0, seed=3), start=1e9)
    store = tmp_path / "tandem.db"
    with RunStore(store) as s:
        s.start_run("live-1", "live", {}, {}, {"world_size": 2})
        s.log_metrics("live-1", rows)
    found = _found(store)
    assert len(rows) <= view_run.LIVE_ROWS
    assert found["latest"] is None and found["rows"] == len(rows)
    assert [f["kind"] for f in found["findings"]] == [
        f.kind for f in diagnose(_dicts(rows), [], config={})]
