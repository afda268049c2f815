"""Pure parts of the dashboard: run segments, JSON-safe values, store paths, host checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tandem.dashboard.auth import is_loopback
from tandem.dashboard.command import store_of
from tandem.dashboard.shape import jsonable, metric_rows, segments
from tandem.dashboard.stream import parse_cursor


def _event(step: int, kind: str, t: float, message: str = "") -> dict:
    return {"step": step, "kind": kind, "time": t, "message": message or kind}


def test_segments_split_at_resumes_and_merge_a_restart_with_its_resume() -> None:
    events = [_event(40, "loss_spike", 5.0), _event(100, "restart", 10.0, "restart 1"),
              _event(100, "resume", 10.5, "resumed from step_100"),
              _event(250, "resume", 20.0, "resumed from step_250")]
    segs = segments(events, started=1.0, last_step=400)
    assert [(s["start_step"], s["end_step"]) for s in segs] == [(0, 100), (100, 250),
                                                                 (250, 400)]
    assert "restart 1" in segs[1]["cause"] and "step_100" in segs[1]["cause"]
    assert segments([], started=1.0, last_step=30) == [
        {"index": 0, "start_step": 0, "started": 1.0, "cause": "start", "end_step": 30}]


def test_jsonable_keeps_nan_as_text_that_json_accepts() -> None:
    value = {"loss": math.nan, "up": math.inf, "down": -math.inf, "n": [1, 2.5], "s": {3}}
    text = json.dumps(jsonable(value), allow_nan=False)
    assert json.loads(text) == {"loss": "NaN", "up": "Infinity", "down": "-Infinity",
                                "n": [1, 2.5], "s": [3]}


def test_stream_rows_are_what_the_generic_walk_makes_of_them() -> None:
    rows = [(7, 10, -1, "loss", 2.5, 1e9), (8, 10, 0, "loss", math.nan, 1e9 + 1),
            (9, 20, 1, "grad_norm", math.inf, 1e9 + 2), (10, 20, -1, "lr", -math.inf, 1e9 + 3),
            (11, 30, -1, "samples_per_s", 0.0, 1e9 + 4)]
    fast = metric_rows(rows)
    assert fast == jsonable([list(r[1:]) for r in rows])
    assert [r[3] for r in fast] == [2.5, "NaN", "Infinity", "-Infinity", 0.0]
    json.dumps(fast, allow_nan=False)  # what the stream sends


def test_cursor_parsing_ignores_garbage() -> None:
    assert parse_cursor("m=12&e=3&x=oops") == {"m": 12, "e": 3}
    assert parse_cursor(None) == {}


def test_loopback_hosts() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.1", "example.com", ""))


def test_the_run_store_of_a_script_from_its_flags(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TANDEM_STORE", raising=False)
    assert store_of([]) == tmp_path / "runs/tandem.db"
    assert store_of(["--run.dir", "out"]) == tmp_path / "out/tandem.db"
    assert store_of(["--monitor.store=/x/s.db", "--run.dir", "out"]) == Path("/x/s.db")
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\ndir = "elsewhere"\n')
    assert store_of(["--config", str(cfg)]) == tmp_path / "elsewhere/tandem.db"
    # The run writes where $TANDEM_STORE says unless the flags name a store: so must the
    # dashboard beside it look.
    monkeypatch.setenv("TANDEM_STORE", str(tmp_path / "env.db"))
    assert store_of(["--run.dir", "out"]) == tmp_path / "env.db"
    assert store_of(["--monitor.store=/x/s.db"]) == Path("/x/s.db")


def test_a_pipelines_stages_get_bubble_heatmaps(tmp_path: Path) -> None:
    from tandem.dashboard.series import run_lines
    from tandem.monitor.store import RunStore

    with RunStore(tmp_path / "runs.db") as store:
        store.start_run("pp-1", "pp", {}, {"strategy": "pp"}, {})
        store.log_metrics("pp-1", [(step, rank, name, 0.1 * (rank + 1) + step / 1000, 0.0)
                                   for step in (5, 10) for rank in (-1, 0, 1)
                                   for name in ("pp/bubble", "pp/bubble_predicted")])
        lines = run_lines(store._conn, "pp-1")
    heat = lines["heatmaps"]["pp/bubble"]
    assert heat["ranks"] == [0, 1] and heat["step"] == [5, 10]
    assert heat["values"][1] == [0.2 + 0.005, 0.2 + 0.01]
    assert "pp/bubble_predicted" in lines["heatmaps"]
