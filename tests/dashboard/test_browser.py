"""The dashboard in a real browser (Chromium via Playwright): every page holds the
store's numbers, long runs keep their spikes, live rows arrive by server-sent events."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import pytest

from tandem.analyze.diagnosis.diagnose import diagnose_run
from tandem.dashboard import view_run
from tandem.monitor.store import RunStore
from tandem.monitor.writer import StoreWriter
from tests.dashboard.conftest import open_page, wait_for

LIVE_DEADLINE_S = 5.0

CHART = """id => { const c = tandem.charts[id]; if (!c) return null;
  return {x: c.u.data[0],
          lines: c.lines.map((l, i) => ({label: l.label, y: c.u.data[i + 1]}))}; }"""
KEYS = "rows => rows.map(r => r.dataset.key)"


def _line(chart: dict[str, Any], label: str) -> list[tuple[float, float]]:
    """(x, y) points of one line of a chart, where it has a value."""
    (line,) = [ln for ln in chart["lines"] if ln["label"] == label]
    return [(x, y) for x, y in zip(chart["x"], line["y"], strict=True) if y is not None]


def _same(got: list[tuple], want: list[tuple], abs_tol: float = 0.0) -> None:
    """Two point lists agree: the same x (to abs_tol), y within float tolerance."""
    assert len(got) == len(want), (len(got), len(want))
    assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=abs_tol)
    assert [g[1] for g in got] == pytest.approx([w[1] for w in want], rel=1e-9)


def _store_points(store: Path, run_id: str, name: str, rank: int = -1) -> list[tuple]:
    with RunStore(store) as s:
        return [(m["step"], m["value"]) for m in s.metrics(run_id, name=name, rank=rank)]


def test_runs_page_lists_runs_newest_first_and_filters(store: Path, serve, page) -> None:
    open_page(page, serve(store).url("/runs", local=True))
    shown = page.eval_on_selector_all("#runs tbody tr", "rows => rows.map(r => r.dataset.run)")
    with RunStore(store) as s:
        runs = s.runs()
    assert shown == [r["run_id"] for r in sorted(runs, key=lambda r: r["started"],
                                                   reverse=True)]
    assert page.inner_text("tr[data-run='live-1']").count("live") >= 1
    page.select_option("#status", "live")
    assert page.eval_on_selector_all("#runs tbody tr", "r => r.map(x => x.dataset.run)") == [
        "live-1"]
    page.select_option("#status", "")
    page.fill("#search", "beta")
    assert page.eval_on_selector_all("#runs tbody tr", "r => r.map(x => x.dataset.run)") == [
        "beta-1"]
    page.fill("#search", "")
    page.check("tr[data-run='alpha-1'] input")
    page.check("tr[data-run='beta-1'] input")
    page.click("#compare")
    page.wait_for_selector("body[data-ready='1'][data-page='compare']")
    assert sorted(r["run_id"] for r in page.evaluate("tandem.compare.runs")) == [
        "alpha-1", "beta-1"]


def test_run_page_holds_the_store_numbers(store: Path, serve, page) -> None:
    open_page(page, serve(store).url("/run/alpha-1", local=True))
    loss = page.evaluate(CHART, "loss")
    _same(_line(loss, "loss"), _store_points(store, "alpha-1", "loss"))
    _same(_line(loss, "eval_loss"), _store_points(store, "alpha-1", "eval_loss"))
    acc = page.evaluate(CHART, "accuracy")
    _same(_line(acc, "accuracy"), _store_points(store, "alpha-1", "accuracy"))
    rate = page.evaluate(CHART, "throughput")
    _same(_line(rate, "samples_per_s"), _store_points(store, "alpha-1", "samples_per_s"))
    # The step-time split: every phase the store holds, with its numbers.
    phases = page.evaluate(CHART, "phases")
    with RunStore(store) as s:
        held = sorted(n for n in s.metric_names("alpha-1") if n.startswith("time/")
                      and n != "time/step")
    assert sorted(ln["label"] for ln in phases["lines"]) == held
    _same(_line(phases, "time/data"), _store_points(store, "alpha-1", "time/data"))
    # Rank x window heatmap of straggler scores: each rank's row is the store's.
    heat = page.evaluate("""() => { const h = tandem.heat['straggler/score'];
        return {step: h.step, ranks: h.ranks, values: h.values}; }""")
    assert heat["ranks"] == [0, 1, 2, 3]
    for rank, row in zip(heat["ranks"], heat["values"], strict=True):
        _same(list(zip(heat["step"], row, strict=True)),
              _store_points(store, "alpha-1", "straggler/score", rank))
    # Memory per rank, a line each (no job-wide row exists).
    mem = page.evaluate(CHART, "mem/rss_bytes")
    _same(_line(mem, "mem/rss_bytes rank 3"),
          _store_points(store, "alpha-1", "mem/rss_bytes", 3))
    # The diagnosis: what tandem.analyze.diagnosis.diagnose finds on the same rows, field by field.
    with RunStore(store) as s:
        expected = diagnose_run(s.run("alpha-1"), s.metrics("alpha-1"), s.events("alpha-1"))
    page.wait_for_selector("#findings .finding")
    kinds = page.eval_on_selector_all("#findings .finding", "f => f.map(x => x.dataset.kind)")
    assert kinds == [f.kind for f in expected] and "straggler" in kinds
    straggler = page.inner_text(".finding[data-kind='straggler'] [data-field='evidence']")
    assert "median straggler score (x)" in straggler and "2" in straggler
    assert page.inner_text("#config").count("bucket_mb") == 1
    # The page asks again no sooner than 1000x the diagnosis's CPU time (at least 30 s),
    # and says over how many rows it was made.
    cost = page.evaluate("tandem.findings.cost_s")
    assert 0 <= cost < 5
    assert page.evaluate("tandem.rediagnoseMs(tandem.findings)") == pytest.approx(
        max(30000, cost * 1e6))
    assert page.evaluate("tandem.rediagnoseMs({cost_s: 0.5})") == 500000
    with RunStore(store) as s:
        n_rows = len(s.metrics("alpha-1"))
    assert f"over the run's {n_rows:,} rows" in page.inner_text("#diagnosed")


def test_new_finding_fields_show_without_changes(store: Path, serve, page,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclasses.dataclass(frozen=True)
    class Checked:
        kind: str
        severity: str
        message: str
        evidence: dict[str, Any]
        validation: dict[str, Any]

    def checked(run, metrics, events=(), window=None) -> list[Checked]:
        return [Checked(f.kind, f.severity, f.message, f.evidence,
                        {"verdict": "confirmed", "predicted_gain": 0.31})
                for f in diagnose_run(run, metrics, events, window)]

    monkeypatch.setattr(view_run, "diagnose_run", checked)
    open_page(page, serve(store).url("/run/beta-1", local=True))
    page.wait_for_selector("[data-field='validation']")
    text = page.inner_text(".finding[data-kind='input-bound'] [data-field='validation']")
    assert "confirmed" in text and "0.31" in text


def test_long_runs_are_downsampled_and_keep_spikes(tmp_path: Path, serve, page) -> None:
    path = tmp_path / "long.db"
    n, spike_at = 20_000, 13_337
    with RunStore(path) as s:
        s.start_run("long-1", "long", {}, {}, {"world_size": 1})
        rows = [(step, -1, "loss", 2.0 / (1 + step / 1000) + (40.0 if step == spike_at else 0),
                 1e9 + step) for step in range(n)]
        s.log_metrics("long-1", rows)
        s.finish_run("long-1", "completed", {})
    open_page(page, serve(path).url("/run/long-1", local=True))
    shown = _line(page.evaluate(CHART, "loss"), "loss")
    assert len(shown) <= 2500
    stored = dict((r[0], r[3]) for r in rows)
    assert all(stored[int(x)] == pytest.approx(y) for x, y in shown)  # real points only
    assert max(y for _, y in shown) == pytest.approx(stored[spike_at])
    assert shown[0][0] == 0 and shown[-1][0] == n - 1


def test_live_rows_arrive_by_server_sent_events(store: Path, serve, browser, page,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A live run longer than LIVE_ROWS is diagnosed on its latest rows, whole steps only:
    # of its 10 loss rows (steps 10-100) the read takes the last 9, and step 20, where
    # the limit fell, is left out.
    monkeypatch.setattr(view_run, "LIVE_ROWS", 8)
    server = serve(store)
    open_page(page, server.url("/run/live-1", local=True))
    page.wait_for_selector("#diagnosed")
    assert "over this live run's latest 8 rows, steps 30-100" in page.inner_text("#diagnosed")
    runs_page = browser.new_page()
    open_page(runs_page, server.url("/runs", local=True))
    page.wait_for_function("document.getElementById('live').textContent === 'live'")
    before = page.evaluate("tandem.updates")
    writer = StoreWriter(store, "live-1")  # the writer a training run uses
    try:
        for step in range(110, 160, 10):
            writer.metric(step, -1, "loss", 2.0 - step / 1000)
            for rank in (0, 1):
                writer.metric(step, rank, "straggler/score", 1.0 + rank * 0.3)
        writer.event(150, -1, "loss_spike", "loss rose 9 robust z", 9.0, 6.0)
        assert writer.flush(10)
        committed = time.monotonic()
        wait_for(lambda: 150 in (page.evaluate(CHART, "loss") or {"x": []})["x"],
                 LIVE_DEADLINE_S, "the appended loss rows on the run page")
        latency = time.monotonic() - committed
        loss = _line(page.evaluate(CHART, "loss"), "loss")
        _same(loss, _store_points(store, "live-1", "loss"))
        wait_for(lambda: page.eval_on_selector_all("#events tbody tr", "r => r.length") == 1,
                 LIVE_DEADLINE_S, "the event in the events table")
        assert page.evaluate("tandem.heat['straggler/score'].values") == [[1.0] * 5, [1.3] * 5]
        assert page.evaluate("tandem.updates") > before
        assert latency < LIVE_DEADLINE_S
    finally:
        writer.close()
    with RunStore(store) as s:
        s.finish_run("live-1", "completed", {"steps": 150})
        s.start_run("late-1", "late", {}, {"strategy": "ddp"}, {"world_size": 2})
    wait_for(lambda: page.inner_text("#status") == "completed", LIVE_DEADLINE_S,
             "the finished status on the run page")
    with RunStore(store) as s:
        n_rows = len(s.metrics("live-1"))
    wait_for(lambda: f"over the run's {n_rows} rows" in page.inner_text("#diagnosed"),
             LIVE_DEADLINE_S, "the finished run's diagnosis over every row")
    wait_for(lambda: runs_page.query_selector("tr[data-run='late-1']"), LIVE_DEADLINE_S,
             "the new run on the runs page")
    assert "completed" in runs_page.inner_text("tr[data-run='live-1']")
    runs_page.close()


def test_compare_overlays_runs_and_marks_differences(store: Path, serve, page) -> None:
    open_page(page, serve(store).url("/compare?runs=alpha-1,beta-1", local=True))
    loss = page.evaluate(CHART, "loss")
    _same(_line(loss, "alpha"), _store_points(store, "alpha-1", "loss"))
    _same(_line(loss, "beta"), _store_points(store, "beta-1", "loss"))
    differs = page.eval_on_selector_all("#summary > table > tbody > tr.differs", KEYS)
    assert "processes" in differs and "steps" in differs and "device" not in differs
    config = page.eval_on_selector_all("#config > table > tbody > tr", KEYS)
    assert "data.workers" in config and "data.prefetch" not in config  # only differences
    page.check("#all-config")
    assert "data.prefetch" in page.eval_on_selector_all("#config > table > tbody > tr",
                                                        KEYS)
    page.select_option("#xaxis", "time")
    by_time = _line(page.evaluate(CHART, "loss"), "alpha")
    with RunStore(store) as s:
        started = s.run("alpha-1")["started"]
        expected = [(m["time"] - started, m["value"])
                    for m in s.metrics("alpha-1", name="loss", rank=-1)]
    _same(by_time, expected, abs_tol=2e-3)


def test_tuner_page_shows_trials_intervals_and_decision(store: Path, serve, page) -> None:
    open_page(page, serve(store).url("/tuner", local=True))
    with RunStore(store) as s:
        trials = s.trials("tune-1")
    ids = page.eval_on_selector_all("#trials > table > tbody > tr",
                                    "r => r.map(x => x.dataset.trial)")
    assert ids == [t["trial_id"] for t in trials]
    assert "control" in page.get_attribute("tr[data-trial='01']", "class")
    assert page.inner_text("tr[data-trial='02']").count("1.31x [1.22, 1.4]") == 1
    # the predicted gain beside the measured one
    cells = page.eval_on_selector_all("tr[data-trial='02'] > td", "c => c.map(x => x.innerText)")
    assert cells[6:8] == ["1.45x", "1.31x [1.22, 1.4]"], cells
    assert page.eval_on_selector_all("#intervals circle", "c => c.length") == 2
    assert "data.workers" in page.inner_text("#decision")
    # the adoption bar: the session's noise floor, and the least it could be (min_gain)
    head = page.inner_text("#head")
    assert "exceeds 1.17x" in head and "at least 1.05x" in head, head
    assert "floor 1.17x" in page.inner_text("#intervals")


def test_tuner_page_without_a_session_waits_for_one(tmp_path: Path, serve, page) -> None:
    path = tmp_path / "tandem.db"
    with RunStore(path) as s:
        s.start_run("plain-1", "plain", {}, {"strategy": "single"}, {"world_size": 1})
    open_page(page, serve(path).url("/tuner", local=True))
    assert "no tune session" in page.inner_text("#head")
    assert page.eval_on_selector_all("h2", "hs => hs.filter(h => h.offsetParent).length") == 0
    page.wait_for_function("document.getElementById('live').textContent === 'live'")
    with RunStore(path) as s:
        s.start_run("tune-2", "tune-late", {"tune": {"min_gain": 0.05}}, {}, {})
        s.log_trial("tune-2", "00", {}, "measured", {"label": "baseline",
                                                    "kind": "baseline"}, "baseline")
    wait_for(lambda: "tune-late" in page.inner_text("#head"), LIVE_DEADLINE_S,
             "the new session on the tuner page")
    assert page.query_selector("tr[data-trial='00']") is not None


@pytest.mark.timeout(60)
def test_token_guards_the_browser_off_loopback(store: Path, serve, browser) -> None:
    server = serve(store, host="0.0.0.0")
    assert server.token and len(server.token) >= 16
    context = browser.new_context()
    try:
        page = context.new_page()
        refused = page.goto(f"http://127.0.0.1:{server.port}/run/alpha-1")
        assert refused.status == 401
        open_page(page, server.url("/run/alpha-1", local=True))  # ?token= once, then a cookie
        assert "token=" not in page.url
        # The stream, the findings and the static files all got through with the cookie.
        page.wait_for_function("document.getElementById('live').textContent === 'live'")
        page.wait_for_selector("#findings .finding")
        assert not math.isnan(page.evaluate("tandem.charts.loss.u.data[1][0]"))
    finally:
        context.close()


def test_pages_say_what_the_analysis_says(tmp_path: Path, serve, page) -> None:
    """A resized run's sizes on the Runs page; a small outlier named so in the events; a
    hyper-parameter search's decision where it has no interval."""
    path = tmp_path / "tandem.db"
    with RunStore(path) as s:
        s.start_run("fit-1", "fit", {}, {"strategy": "ddp"}, {"world_size": 2})
        s.log_metrics("fit-1", [row for i in range(40) for row in (
            (10 * (i + 1), -1, "loss", 2.3 * 0.8 ** i, 1000.0 + i),
            (10 * (i + 1), -1, "grad_norm", 1.5 * 0.85 ** i, 1000.0 + i))])
        for i, size in enumerate((2, 1, 2)):
            s.log_event("fit-1", 100 * i, -1, "segment", f"{size} x cpu", float(size),
                        time_s=1000.0 + i)
        s.log_event("fit-1", 305, -1, "loss_spike", "z 40", 0.09)  # 3.9% of the start
        s.log_event("fit-1", 306, -1, "loss_spike", "z 60", 0.2)  # 8.7%: instability
        s.finish_run("fit-1", "completed", {"steps": 400})
        decision = ("keep the current settings: the best trial (03, 2.29 s) was not under "
                    "2.22 s (the current settings' 2.34 s less 5%) in its one run; nothing "
                    "to confirm")
        s.start_run("tune-hp", "tune-hp", {"tune": {"mode": "hparams", "min_gain": 0.05}},
                    {}, {})
        s.log_trial("tune-hp", "00", {}, "complete", {"label": "baseline",
                                                      "kind": "hparams"}, "baseline")
        s.finish_run("tune-hp", "completed", {"chosen": {}, "trials": 1, "decision": decision})
    server = serve(path)
    open_page(page, server.url("/runs", local=True))
    assert "2 → 1 → 2" in page.inner_text("tr[data-run='fit-1']")
    open_page(page, server.url("/run/fit-1", local=True))
    rows = page.inner_text("#events")
    assert "loss_spike (small)" in rows and rows.count("(small)") == 1, rows
    open_page(page, server.url("/tuner?session=tune-hp", local=True))
    assert decision in page.inner_text("#intervals")
    assert decision in page.inner_text("#decision")


def test_run_page_draws_a_compression_experiment(tmp_path: Path, serve, page) -> None:
    """`tandem compress`'s trials on a run: its page shows both trade-off charts, one dot
    per model with the adopted one ringed, and the candidates' table."""
    from tandem.analyze.report.compression import record
    from tests.unit.test_compression_report import RESULT

    path = tmp_path / "tandem.db"
    with RunStore(path) as s:
        s.start_run("plain-1", "plain", {}, {"strategy": "single"}, {"world_size": 1})
        s.finish_run("plain-1", "completed", {})
        record(s, "plain-1", RESULT)
    open_page(page, serve(path).url("/run/plain-1", local=True))
    assert page.is_visible("#compression")
    charts = page.query_selector_all("#compression svg.chart")
    assert len(charts) == 2
    for chart in charts:
        assert len(chart.query_selector_all("circle.dot")) == 3
        ringed = chart.query_selector_all("circle.chosen")
        assert [c.evaluate("c => c.textContent") for c in ringed] == ["prune-50%"]
    assert "lowrank-25%" in page.inner_text("#compression table")
