"""The Scheduler page in a real browser (Chromium via Playwright): the store's jobs,
queue, allocations and resizes on the page, and jobs submitted while it is open arriving
by server-sent events."""

from __future__ import annotations

import time
from pathlib import Path

from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.records import Attempt
from tests.dashboard.conftest import open_page, wait_for
from tests.dashboard.sched_history import job, write_history
from tests.dashboard.test_browser import CHART

LIVE_DEADLINE_S = 5.0
ROW_IDS = "rows => rows.map(r => r.dataset.job)"


def secs(s: float) -> str:
    """A duration as the page writes it (tenths of seconds, minutes, hours)."""
    if s < 120:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def held_by_store(path: Path) -> tuple[float, list[float], dict[str, dict[float, int | None]]]:
    """(first submission, every launch and end time, job -> time -> processes held), from
    the attempts SchedStore returns: what a job holds from each launch until its end,
    None before its first launch and after its last end."""
    with SchedStore(path) as store:
        jobs, attempts = store.jobs(), store.attempts()
    times = sorted({a.launched for a in attempts} | {a.ended for a in attempts if a.ended})
    out: dict[str, dict[float, int | None]] = {}
    for j in jobs:
        mine = [a for a in attempts if a.job_id == j.job_id]
        if not mine:
            continue
        first = min(a.launched for a in mine)
        last = max(a.ended for a in mine) if all(a.ended for a in mine) else float("inf")
        out[f"{j.job_id} {j.name}"] = {
            t: None if t < first or t > last else sum(
                a.procs for a in mine if a.launched <= t and (a.ended is None or t < a.ended))
            for t in times}
    return min(j.submitted for j in jobs), times, out


def _at(chart: dict, label: str, x: float) -> int | None:
    (line,) = [ln for ln in chart["lines"] if ln["label"] == label]
    (i,) = [i for i, v in enumerate(chart["x"]) if abs(v - x) < 1e-6]
    return line["y"][i]


def test_sched_page_holds_the_stores_jobs_and_takes_new_ones_live(tmp_path: Path, serve,
                                                                  page) -> None:
    path = tmp_path / "tandem.db"
    write_history(path, tmp_path)
    open_page(page, serve(path).url("/sched", local=True))
    with SchedStore(path) as store:
        jobs = store.jobs()
    assert page.eval_on_selector_all("#jobs-table tbody tr", ROW_IDS) == [
        j.job_id for j in jobs]
    for j in jobs:
        row = f"#jobs-table tr[data-job='{j.job_id}']"
        assert page.inner_text(f"{row} [data-field='state']").startswith(j.state)
        assert page.inner_text(f"{row} [data-field='procs']") == f"{j.min_procs}:{j.max_procs}"
        if j.finished is not None:
            assert page.inner_text(f"{row} [data-field='jct']") == secs(j.finished - j.submitted)
    assert page.get_attribute("tr[data-job='j1'] [data-field='run'] a", "href") == (
        "/run/run-alpha")
    assert page.query_selector("tr[data-job='j4'] [data-field='run'] a") is None
    assert page.eval_on_selector_all("#queue-table tbody tr", ROW_IDS) == ["j3", "j4"]
    assert page.inner_text("tr[data-key='j1/1'] [data-field='latency']") == secs(40.0 - 30.0)
    assert page.inner_text("tr[data-key='j3/1'] [data-field='latency']") == "–"

    # The allocation chart: each job's processes and their sum at every change.
    origin, times, held = held_by_store(path)
    chart = page.evaluate(CHART, "allocations")
    assert sorted(ln["label"] for ln in chart["lines"]) == sorted([*held, "all jobs"])
    for t in times:
        for label, by_time in held.items():
            assert _at(chart, label, t - origin) == by_time[t], (label, t - origin)
        assert _at(chart, "all jobs", t - origin) == sum(v or 0 for v in
                                                         (h[t] for h in held.values()))
    assert max(_at(chart, "all jobs", t - origin) for t in times) == 4  # the 4 slots

    # A job submitted and one launched while the page is open: no reload.
    page.evaluate("window.notReloaded = true")
    with SchedStore(path) as store:
        store.submit(job("late", time.time(), 0, (1, 2), tmp_path))
        launched = time.time()
        assert store.open_attempt("j4", Attempt(job_id="j4", attempt=1, backend="local",
                                                procs=1, launched=launched), 1, None)
    wait_for(lambda: page.query_selector("#jobs-table tr[data-job='j7']"), LIVE_DEADLINE_S,
             "the submitted job in the jobs table")
    wait_for(lambda: page.eval_on_selector_all("#queue-table tbody tr", ROW_IDS) == [
        "j3", "j7"], LIVE_DEADLINE_S, "the queue without the launched job, with the new one")
    assert page.inner_text("tr[data-job='j7'] [data-field='state']").startswith("queued")
    chart = page.evaluate(CHART, "allocations")
    assert _at(chart, "j4 delta", launched - origin) == 1
    assert _at(chart, "all jobs", launched - origin) == 2 + 1  # beta's 2 and delta's 1
    assert page.evaluate("window.notReloaded") is True


def test_sched_page_without_a_scheduler_says_so_then_fills_in(store: Path, serve,
                                                              page) -> None:
    open_page(page, serve(store).url("/sched", local=True))
    assert "no scheduler has used this store" in page.inner_text("#head")
    assert page.is_hidden("#content")
    with SchedStore(store) as sched:  # the first submission creates the tables
        sched.submit(job("first", time.time(), 0, (1, 1), store.parent))
    wait_for(lambda: page.query_selector("#jobs-table tr[data-job='j1']"), LIVE_DEADLINE_S,
             "the first job once the scheduler's tables exist")
    assert page.eval_on_selector_all("#queue-table tbody tr", ROW_IDS) == ["j1"]
    assert "no scheduler service has run" in page.inner_text("#head")
