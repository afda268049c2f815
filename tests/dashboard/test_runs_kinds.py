"""The Runs page lists the user's runs by default; the tuner's trial and control runs only
when its kind filter asks, and its count says how many runs it leaves out."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

from tandem.dashboard import view_runs
from tandem.monitor.store import RunStore
from tests.dashboard.conftest import build_store, get, get_json

# The tune session tune-1 of build_store, and the runs it launched (named after it).
TRIALS = {"tune-1-000-baseline": "trial", "tune-1-001-placebo": "control",
          "tune-1-002-candidate": "trial"}


def store_with_trials(tmp: Path) -> Path:
    path = build_store(tmp / "tandem.db")
    with RunStore(path) as s:
        for run_id, kind in TRIALS.items():
            s.start_run(run_id, run_id, {"run": {"kind": kind}}, {"strategy": "ddp"},
                        {"world_size": 2})
            s.finish_run(run_id, "completed", {"steps": 20})
    return path


def ids_of_kind(path: Path, kinds: tuple[str, ...]) -> set[str]:
    conn = sqlite3.connect(path)  # the store itself, not the dashboard's queries
    try:
        return {r[0] for r in conn.execute("SELECT run_id, kind FROM runs") if r[1] in kinds}
    finally:
        conn.close()


def test_runs_page_shows_the_users_runs_unless_asked_for_the_tuners(tmp_path: Path,
                                                                     serve) -> None:
    path = store_with_trials(tmp_path)
    base = serve(path).url("", local=True)
    users = ids_of_kind(path, ("user",))
    assert users == {"alpha-1", "beta-1", "tune-1", "live-1"}

    default = get_json(base + "/api/runs")
    assert {r["run_id"] for r in default["runs"]} == users
    assert default["kind"] == "user" and {r["kind"] for r in default["runs"]} == {"user"}
    # the count the page prints: every choice of the filter, so what is left out is known
    assert default["kind_counts"] == {"user": 4, "tuner": 3, "all": 7, "trial": 2,
                                      "control": 1}

    tuner = get_json(base + "/api/runs?kind=tuner")["runs"]
    assert {r["run_id"]: r["kind"] for r in tuner} == TRIALS
    every = get_json(base + "/api/runs?kind=all")["runs"]
    assert {r["run_id"] for r in every} == users | set(TRIALS)
    assert [r["run_id"] for r in get_json(base + "/api/runs?kind=control")["runs"]] == [
        "tune-1-001-placebo"]

    status, body, _ = get(base + "/api/runs?kind=trials")
    assert status == 400 and b"'trials'" in body and b"user, tuner, all" in body

    # The page itself: the filter is there, and the embedded data holds no trial run.
    status, html, _ = get(base + "/runs")
    assert status == 200
    text = html.decode()
    select = re.search(r'<select id="kind".*?</select>', text, re.S)
    assert select is not None, text[:2000]
    assert re.findall(r'<option value="(\w+)"', select.group(0)) == ["user", "tuner", "all"]
    assert not any(run_id in text for run_id in TRIALS)
    assert all(run_id in get(base + "/runs?kind=all")[1].decode() for run_id in TRIALS)


def test_live_updates_keep_to_the_kind_and_recount(tmp_path: Path) -> None:
    path = store_with_trials(tmp_path)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        page = {"kind": "user"}
        cursor = view_runs.load(conn, page)["cursor"]
        with RunStore(path) as s:
            s.start_run("tune-1-003-control", "tune-1-003-control", {"run": {"kind": "control"}},
                        {}, {})
            s.start_run("mine-1", "mine", {}, {}, {})
        update, _ = view_runs.updates(conn, page, cursor)
        every, _ = view_runs.updates(conn, {"kind": "all"}, cursor)
    finally:
        conn.close()
    assert update is not None and every is not None
    # new runs change the statuses: every line of the kind is sent again, and only those
    assert {r["run_id"] for r in update["runs"]} == ids_of_kind(path, ("user",))
    assert "mine-1" in ids_of_kind(path, ("user",))
    assert {r["run_id"] for r in every["runs"]} == ids_of_kind(path, ("user", "trial",
                                                                       "control"))
    assert update["kind_counts"]["user"] == 5 and update["kind_counts"]["tuner"] == 4

