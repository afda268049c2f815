"""The dashboard's server without a browser: read-only store, tokens, incremental streams."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tandem.dashboard.reader import Reader
from tandem.monitor.store import RunStore
from tests.dashboard.conftest import get, get_json
from tests.dist.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
ROUTES = ["/runs", "/run/alpha-1", "/compare?runs=alpha-1,beta-1", "/tuner", "/sched",
          "/api/runs", "/api/run/alpha-1", "/api/run/alpha-1/findings",
          "/api/compare?runs=alpha-1,beta-1", "/api/tuner?session=tune-1", "/api/sched",
          "/static/run.js", "/static/sched.js", "/static/vendor/uplot/uPlot.iife.min.js"]


def _fingerprint(path: Path) -> tuple[str, int]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_the_store_is_never_written(store: Path, serve) -> None:
    before = _fingerprint(store)
    server = serve(store)
    base = server.url("", local=True)
    for route in ROUTES:
        status, body, _ = get(base + route)
        assert status == 200, (route, body[:200])
    assert _fingerprint(store) == before
    # The app's own connections refuse writes (SQLite mode=ro), from any thread.
    reader = server.app.state.dashboard.reader
    conn = reader.connection()
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        conn.execute("INSERT INTO meta VALUES ('dashboard', 'was here')")
    other = Reader(store)
    with pytest.raises(sqlite3.OperationalError):
        other.connection().execute("DELETE FROM runs")
    other.close()
    server.stop()
    assert _fingerprint(store) == before
    with RunStore(store) as check:  # what a writer sees: nothing changed
        assert [r["run_id"] for r in check.runs()] == ["alpha-1", "beta-1", "tune-1", "live-1"]


def test_pages_json_matches_the_store(store: Path, serve) -> None:
    base = serve(store).url("", local=True)
    runs = get_json(base + "/api/runs")["runs"]
    with RunStore(store) as s:
        expected = sorted(s.runs(), key=lambda r: r["started"], reverse=True)
        assert [r["run_id"] for r in runs] == [r["run_id"] for r in expected]
        assert {r["run_id"]: r["status"] for r in runs} == {
            r["run_id"]: r["status"] for r in expected}
        loss = s.metrics("alpha-1", name="loss", rank=-1)
    data = get_json(base + "/api/run/alpha-1")
    line = data["series"]["loss"]["-1"]
    assert line["step"] == [m["step"] for m in loss]
    assert line["value"] == pytest.approx([m["value"] for m in loss], rel=1e-12)
    assert get(base + "/run/nope")[0] == 404
    assert get(base + "/api/run/alpha-1?points=2")[0] == 400


def _read_update(resp, deadline: float) -> dict:
    """The data of the next `update` message of an open SSE response."""
    event = None
    while time.monotonic() < deadline:
        line = resp.readline().decode().rstrip("\n")
        if line.startswith("event:"):
            event = line.split(":", 1)[1].strip()
        elif line.startswith("data:") and event == "update":
            return json.loads(line.split(":", 1)[1])
    raise AssertionError("no update message before the deadline")


def test_stream_sends_only_rows_past_the_cursor(store: Path, serve) -> None:
    import urllib.parse
    import urllib.request

    base = serve(store).url("", local=True)
    cursor = get_json(base + "/api/run/live-1")["cursor"]
    url = (base + "/stream/run/live-1?cursor="
           + urllib.parse.quote(urllib.parse.urlencode(cursor)))
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.readline().startswith(b": connected")
        new = [(110, -1, "loss", 1.9, time.time()), (110, 0, "mem/rss_bytes", 1e9, time.time())]
        with RunStore(store) as s:
            s.log_metrics("live-1", new)
            s.log_metrics("alpha-1", [(999, -1, "loss", 0.5, time.time())])  # another run
            s.log_event("live-1", 110, -1, "target", "accuracy reached 0.9")
        got = _read_update(resp, time.monotonic() + 10)
        rows = list(got.get("rows", []))
        if "events" not in got:  # rows and the event were two commits: maybe two messages
            more = _read_update(resp, time.monotonic() + 10)
            rows += more.get("rows", [])
            got["events"] = more["events"]
    assert [tuple(r[:4]) for r in rows] == [r[:4] for r in new]
    assert [e["kind"] for e in got["events"]] == ["target"]


def test_a_stream_coalesces_commits_that_come_faster_than_its_gap(store: Path, serve) -> None:
    """20 commits within a second reach the page as a few messages, every row once, in
    order, the messages at least MIN_GAP_S apart (one message per commit without it)."""
    import urllib.parse
    import urllib.request

    from tandem.dashboard.stream import MIN_GAP_S

    base = serve(store).url("", local=True)
    cursor = get_json(base + "/api/run/live-1")["cursor"]
    url = (base + "/stream/run/live-1?cursor="
           + urllib.parse.quote(urllib.parse.urlencode(cursor)))
    steps = list(range(200, 220))
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.readline().startswith(b": connected")

        def write() -> None:
            with RunStore(store) as s:
                for step in steps:  # one commit each, 50 ms apart: 20 in about a second
                    s.log_metrics("live-1", [(step, -1, "loss", 1.0, time.time())])
                    time.sleep(0.05)

        writer = threading.Thread(target=write)
        started = time.monotonic()
        writer.start()
        got: list[int] = []
        arrived: list[float] = []  # read as they come, while the writer commits
        while len(got) < len(steps):
            got += [row[0] for row in _read_update(resp, time.monotonic() + 10)["rows"]]
            arrived.append(time.monotonic())
        writer.join()
        span = arrived[-1] - started
    assert got == steps
    gaps = [b - a for a, b in zip(arrived, arrived[1:], strict=False)]
    assert len(arrived) <= min(span / MIN_GAP_S + 2, len(steps) / 4), (len(arrived), span)
    assert all(g >= MIN_GAP_S * 0.8 for g in gaps), gaps


def _tandem(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tandem.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT)


def _url_from(proc: subprocess.Popen, deadline_s: float = 60) -> str:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if "http://" in line:
            return line[line.index("http://"):].strip()
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no URL printed (exit {proc.poll()})")


@pytest.mark.timeout(90)
def test_token_is_required_off_loopback(store: Path) -> None:
    token = "t0ken-for-tests-" + "x" * 16
    # This checkout's tandem, not whichever one the environment has installed.
    env = dict(os.environ, TANDEM_DASHBOARD_TOKEN=token,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    port = free_port()
    proc = _tandem("dashboard", "--store", str(store), "--host", "0.0.0.0", "--port",
                   str(port), env=env)
    try:
        url = _url_from(proc)
        assert f"token={token}" in url and f":{port}/" in url
        base = f"http://127.0.0.1:{port}"
        for route in [*ROUTES, "/stream/runs", "/stream/sched"]:
            status, _, headers = get(base + route)
            assert status == 401, route
            assert get(base + route, {"Authorization": "Bearer wrong" + token})[0] == 401
            if not route.startswith("/stream"):
                assert get(base + route, {"Authorization": f"Bearer {token}"})[0] == 200
                assert get(base + route, {"Cookie": f"tandem_dashboard={token}"})[0] == 200
        status, _, headers = get(f"{base}/runs?token={token}")
        assert status == 303 and headers["location"] == "/runs"
        assert f"tandem_dashboard={token}" in headers["set-cookie"]
        assert "HttpOnly" in headers["set-cookie"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_loopback_refuses_foreign_host_headers(store: Path, serve) -> None:
    base = serve(store).url("", local=True)
    assert get(base + "/runs")[0] == 200
    assert get(base + "/runs", {"Host": "attacker.example:80"})[0] == 403
    assert get(base + "/api/runs", {"Host": "localhost:1"})[0] == 200


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread priorities are Linux's")
@pytest.mark.parametrize("priority", ["idle", "low", "normal"])
def test_the_server_runs_at_a_lower_priority_and_the_run_does_not(store: Path, serve,
                                                                    priority: str) -> None:
    """Beside a run the server shares the launcher's process: its own threads (the event
    loop and the worker threads that query the store) take the priority, the caller's
    thread keeps its own."""
    me = threading.get_native_id()
    nice, policy = os.getpriority(os.PRIO_PROCESS, me), os.sched_getscheduler(me)
    server = serve(store, priority=priority)
    assert get(server.url("/api/runs", local=True))[0] == 200  # the query uses a worker
    threads = {t.name: t.native_id for t in threading.enumerate()}
    workers = [tid for name, tid in threads.items() if name.startswith("AnyIO worker")]
    assert workers
    want_nice = nice if priority == "normal" else max(19, nice)  # never raised
    want_policy = os.SCHED_IDLE if priority == "idle" else policy
    for tid in [threads["tandem-dashboard"], *workers]:
        assert (os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)) == \
            (want_nice, want_policy)
    assert (os.getpriority(os.PRIO_PROCESS, me), os.sched_getscheduler(me)) == (nice, policy)


def test_an_unknown_priority_is_refused_naming_the_choices(store: Path) -> None:
    from tandem.dashboard.server import DashboardServer

    with pytest.raises(ValueError, match="'lowest' is not one of idle, low, normal"):
        DashboardServer(store, priority="lowest")


def test_short_tokens_are_refused(store: Path) -> None:
    from tandem.dashboard.server import DashboardServer

    with pytest.raises(ValueError, match="token"):
        DashboardServer(store, host="127.0.0.1", token="short")


def test_outliers_small_on_the_runs_scale_are_marked_so(tmp_path: Path, serve) -> None:
    """The page colours an outlier as the health finding judges it: a loss at most 5% of
    the starting loss, or a gradient norm at most the starting one, is small."""
    from tandem.dashboard import view_run

    path = tmp_path / "runs.db"
    with RunStore(path) as s:
        s.start_run("fit-1", "fit", {}, {"strategy": "single"}, {"world_size": 1})
        # starting loss 2.3 and gradient norm 1.5 (the largest of the first 3 windows)
        s.log_metrics("fit-1", [row for i in range(40) for row in (
            (10 * (i + 1), -1, "loss", 2.3 * 0.8 ** i, float(i)),
            (10 * (i + 1), -1, "grad_norm", 1.5 * 0.85 ** i, float(i)))])
        s.log_event("fit-1", 305, -1, "loss_spike", "z 40", 0.09)  # 3.9% of 2.3
        s.log_event("fit-1", 306, -1, "loss_spike", "z 60", 0.2)  # 8.7%
        s.log_event("fit-1", 307, -1, "grad_explosion", "z 90", 0.84)  # under 1.5
        s.log_event("fit-1", 308, -1, "grad_explosion", "z 99", 2.0)
        s.log_event("fit-1", 309, -1, "nonfinite", "loss nan", float("nan"))
    events = get_json(serve(path).url("", local=True) + "/api/run/fit-1")["events"]
    assert [(e["step"], e["small"]) for e in events] == [
        (305, True), (306, False), (307, True), (308, False), (309, False)]
    # a live update judges new outliers the same way
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        _, cursor = view_run.updates(conn, {"run_id": "fit-1"}, {})
        with RunStore(path) as s:
            s.log_event("fit-1", 310, -1, "loss_spike", "z 50", 0.1)
            s.log_event("fit-1", 311, -1, "grad_explosion", "z 70", 1.6)
        update, _ = view_run.updates(conn, {"run_id": "fit-1"}, cursor)
    finally:
        conn.close()
    assert [(e["step"], e["small"]) for e in update["events"]] == [(310, True), (311, False)]


def test_runs_page_gives_every_size_a_resized_run_ran_at(tmp_path: Path, serve) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path) as s:
        s.start_run("job-1", "job", {}, {"strategy": "ddp"}, {"world_size": 2})
        s.start_run("job-2", "steady", {}, {"strategy": "ddp"}, {"world_size": 2})
        # attempts at 2, 1, 1 (a restart at the same size) and 2 processes; the env the
        # store keeps is the last attempt's
        for i, size in enumerate((2, 1, 1, 2)):
            s.log_event("job-1", 100 * i, -1, "segment", f"{size} x cpu, ddp", float(size),
                        time_s=1000.0 + i)
        s.log_event("job-2", 0, -1, "segment", "2 x cpu, ddp", 2.0)
    runs = {r["run_id"]: r for r in get_json(serve(path).url("", local=True) + "/api/runs")[
        "runs"]}
    assert runs["job-1"]["sizes"] == [2, 1, 2] and runs["job-1"]["world_size"] == 2
    assert runs["job-2"]["sizes"] == [2]
