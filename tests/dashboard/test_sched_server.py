"""The Scheduler page's server side: /api/sched against a history written by the
scheduler's own code, the store without scheduler tables, no write to the store, and a
stream that sends only the jobs that are new or changed."""

from __future__ import annotations

import json
import sqlite3
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tandem.dashboard import sched_queries
from tandem.sched.service import records
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.records import Attempt
from tests.dashboard.conftest import get, get_json
from tests.dashboard.sched_history import SERVICE_FACTS, job, write_history
from tests.dashboard.test_server import _fingerprint, _read_update

SCHED_ROUTES = ["/sched", "/api/sched"]


@pytest.fixture
def sched_store(tmp_path: Path) -> Path:
    """A store holding the history of tests/dashboard/sched_history.py."""
    path = tmp_path / "tandem.db"
    write_history(path, tmp_path)
    return path


def _tables(path: Path) -> list[str]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return sorted(r[0] for r in conn.execute("SELECT name FROM sqlite_master "
                                                 "WHERE type='table'"))
    finally:
        conn.close()


def test_the_dashboard_knows_the_schedulers_active_states() -> None:
    assert sched_queries.ACTIVE_STATES == records.ACTIVE


def test_jobs_queue_resizes_and_decision_match_the_store(sched_store: Path, serve) -> None:
    base = serve(sched_store).url("", local=True)
    status, body, _ = get(base + "/api/sched")
    assert status == 200
    assert b"never-shown" not in body and b'"env"' not in body  # a job's env stays private
    data = json.loads(body)
    with SchedStore(sched_store) as store:
        jobs, resizes, decisions = store.jobs(), store.resizes(), store.decisions()
        attempts = {j.job_id: store.attempts(j.job_id) for j in jobs}
    assert data["scheduler"] is True
    assert [j["job_id"] for j in data["jobs"]] == [j.job_id for j in jobs]
    for got, want in zip(data["jobs"], jobs, strict=True):
        tried = attempts[want.job_id]
        assert (got["name"], got["state"], got["min_procs"], got["max_procs"], got["procs"],
                got["priority"]) == (want.name, want.state, want.min_procs, want.max_procs,
                                     want.procs, want.priority)
        assert got["submitted"] == want.submitted and got["finished"] == want.finished
        assert [a["attempt"] for a in got["attempts"]] == [a.attempt for a in tried]
        assert [(a["procs"], a["launched"], a["ended"]) for a in got["attempts"]] == [
            (a.procs, a.launched, a.ended) for a in tried]
        assert got["started"] == (tried[0].launched if tried else None)
        if want.finished is None:
            assert got["jct"] is None
        else:
            assert got["jct"] == pytest.approx(want.finished - want.submitted, abs=1e-9)
    by_id = {j["job_id"]: j for j in data["jobs"]}
    assert [by_id[i]["state"] for i in sorted(by_id)] == [
        "completed", "running", "queued", "queued", "cancelled", "failed"]
    assert by_id["j1"]["jct"] == pytest.approx(80.0)  # submitted at 0, completed at 80
    assert by_id["j6"]["jct"] == pytest.approx(60.0 - 10.0)  # 60 .. 110
    assert {i: j["run_id"] for i, j in by_id.items()} == {
        "j1": "run-alpha", "j2": "run-beta", "j3": "run-gamma", "j4": None, "j5": None,
        "j6": None}
    assert data["queue"] == ["j3", "j4"] == [j.job_id for j in jobs if j.state == "queued"]
    got_resizes = {(r["job_id"], r["attempt"]): r for r in data["resizes"]}
    assert sorted(got_resizes) == sorted((r["job_id"], r["attempt"]) for r in resizes)
    resize, preempt = got_resizes[("j1", 1)], got_resizes[("j3", 1)]
    assert (resize["kind"], resize["from_procs"], resize["to_procs"]) == ("resize", 4, 2)
    assert resize["to_training_s"] == pytest.approx(40.0 - 30.0)  # decided 30, trains at 40
    assert resize["stop_s"] == pytest.approx(33.0 - 30.0)
    assert (resize["stopped_step"], resize["resumed_step"], resize["steps_redone"]) == (
        300, 300, 0)
    assert resize["closed"] is True
    assert (preempt["kind"], preempt["from_procs"], preempt["to_procs"]) == ("preempt", 2, 0)
    assert preempt["to_training_s"] is None and preempt["closed"] is False
    assert preempt["stopped_step"] == 120  # lost: the last window before it ended
    latest = decisions[-1]
    assert {k: data["decision"][k] for k in ("seq", "time", "policy", "allocations",
                                            "changes")} == {
        k: latest[k] for k in ("seq", "time", "policy", "allocations", "changes")}
    assert data["decision"]["count"] == len(decisions) == 3
    assert data["service"]["service"] == SERVICE_FACTS


def test_a_store_without_scheduler_tables_gets_an_empty_page(store: Path, serve) -> None:
    before, tables = _fingerprint(store), _tables(store)
    assert not any(t.startswith("sched_") for t in tables)
    base = serve(store).url("", local=True)
    data = get_json(base + "/api/sched")
    assert data["scheduler"] is False
    assert (data["jobs"], data["queue"], data["resizes"], data["decision"]) == ([], [], [],
                                                                               None)
    status, body, _ = get(base + "/sched")
    assert status == 200 and b'src="/static/sched.js"' in body
    assert _tables(store) == tables and _fingerprint(store) == before


def test_the_scheduler_page_never_writes_the_store(sched_store: Path, serve) -> None:
    watch = sqlite3.connect(f"{sched_store.resolve().as_uri()}?mode=ro", uri=True)
    try:
        version = watch.execute("PRAGMA data_version").fetchone()[0]
        before = _fingerprint(sched_store)
        server = serve(sched_store)
        base = server.url("", local=True)
        for route in SCHED_ROUTES:
            assert get(base + route)[0] == 200, route
        with urllib.request.urlopen(base + "/stream/sched", timeout=10) as resp:
            assert resp.readline().startswith(b": connected")
            update = _read_update(resp, time.monotonic() + 10)  # from an empty cursor
        assert len(update["jobs"]) == 6
        server.stop()
        # data_version moves when any other connection commits; the dashboard made none.
        assert watch.execute("PRAGMA data_version").fetchone()[0] == version
        assert _fingerprint(sched_store) == before
        with SchedStore(sched_store) as store:  # a writer's commit: the probe sees it
            store.set_service_value("probe", "1")
        assert watch.execute("PRAGMA data_version").fetchone()[0] != version
    finally:
        watch.close()


def test_the_stream_sends_only_new_or_changed_jobs(sched_store: Path, serve,
                                                   tmp_path: Path) -> None:
    base = serve(sched_store).url("", local=True)
    cursor = get_json(base + "/api/sched")["cursor"]
    url = base + "/stream/sched?cursor=" + urllib.parse.quote(urllib.parse.urlencode(cursor))
    with urllib.request.urlopen(url, timeout=10) as resp, SchedStore(sched_store) as store:
        assert resp.readline().startswith(b": connected")
        store.submit(job("late", time.time(), 0, (1, 2), tmp_path))
        got = _read_update(resp, time.monotonic() + 10)
        assert [j["job_id"] for j in got["jobs"]] == ["j7"]
        assert got["queue"] == ["j3", "j4", "j7"]
        assert "resizes" not in got and "decision" not in got
        assert store.open_attempt("j4", Attempt(job_id="j4", attempt=1, backend="local",
                                                procs=1, launched=time.time()), 1, None)
        got = _read_update(resp, time.monotonic() + 10)
        assert [(j["job_id"], j["state"], len(j["attempts"])) for j in got["jobs"]] == [
            ("j4", "running", 1)]
        assert got["queue"] == ["j3", "j7"]
        store.record_decision("goodput", "local", {"j2": 2, "j4": 1}, {"j4": "start on 1"})
        got = _read_update(resp, time.monotonic() + 10)
        assert "jobs" not in got and got["decision"]["changes"] == {"j4": "start on 1"}
        store.cancel("j7")  # a queued job changes in place: it is sent again
        got = _read_update(resp, time.monotonic() + 10)
        assert [(j["job_id"], j["state"]) for j in got["jobs"]] == [("j7", "cancelled")]
        assert got["queue"] == ["j3"]
