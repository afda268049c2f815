"""The run store (SQLite, WAL, versioned schema) and its background writer."""

from __future__ import annotations

import logging
import math
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tandem.monitor import store as store_mod
from tandem.monitor import writer as writer_mod
from tandem.monitor.store import STATUSES, RunStore, StoreVersionError, environment
from tandem.monitor.writer import StoreWriter

pytestmark = pytest.mark.timeout(60)


def _count(path: Path, run_id: str) -> int:
    with RunStore(path) as reader:
        return len(reader.metrics(run_id))


def _wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        store.start_run("a1b2c3", "mnist", {"train": {"steps": 5}}, {"strategy": "ddp"},
                        {"torch": "x", "world_size": 2})
        rows = [(10, -1, "loss", 2.5, 100.0), (10, 0, "time/step", 0.1, 100.0),
                (10, 1, "time/step", 0.2, 100.0), (20, -1, "loss", math.nan, 101.0)]
        assert store.log_metrics("a1b2c3", rows) == 4
        store.log_event("a1b2c3", 20, -1, "nan", "loss is NaN", value=math.nan, threshold=None)
        store.finish_run("a1b2c3", "failed", {"final_loss": math.nan, "steps": 20})
    with RunStore(path) as store:
        run = store.run("a1b2c3")
        assert run["name"] == "mnist" and run["status"] == "failed"
        assert run["config"] == {"train": {"steps": 5}} and run["plan"] == {"strategy": "ddp"}
        assert run["env"]["world_size"] == 2 and run["finished"] >= run["started"]
        assert math.isnan(run["summary"]["final_loss"])
        loss = store.metrics("a1b2c3", name="loss")
        assert [(m["step"], m["rank"]) for m in loss] == [(10, -1), (20, -1)]
        assert loss[0]["value"] == 2.5 and math.isnan(loss[1]["value"])
        assert [m["value"] for m in store.metrics("a1b2c3", rank=1)] == [0.2]
        assert store.metric_names("a1b2c3") == ["loss", "time/step"]
        (event,) = store.events("a1b2c3")
        assert event["kind"] == "nan" and event["step"] == 20 and event["value"] is None
        assert [r["run_id"] for r in store.runs()] == ["a1b2c3"]
        assert store._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_run_lookup_by_prefix_and_name(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        for run_id in ("abc111", "abc222", "xyz999"):
            store.start_run(run_id, "same" if run_id != "xyz999" else "other", {}, {}, {})
            time.sleep(0.01)  # distinct start times: "latest wins" must be decidable
        assert store.run("xy")["run_id"] == "xyz999"
        assert store.run("abc1")["run_id"] == "abc111"
        assert store.run("same")["run_id"] == "abc222"  # latest of that name
        with pytest.raises(ValueError, match="ambiguous.*abc111, abc222"):
            store.run("abc")
        with pytest.raises(ValueError, match="no run with id, id prefix or name 'nope'"):
            store.run("nope")
        with pytest.raises(ValueError, match="no run with id, id prefix or name 'ABC1'"):
            store.run("ABC1")  # prefixes are case-sensitive, unlike SQL LIKE


def test_finish_rejects_bad_status_and_unknown_run(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        store.start_run("r", "n", {}, {}, {})
        ended = ", ".join(s for s in STATUSES if s != "running")
        with pytest.raises(ValueError, match=f"{ended}; got 'done'"):
            store.finish_run("r", "done", {})
        with pytest.raises(ValueError, match="no run with id 'q'"):
            store.finish_run("q", "completed", {})


def test_restarting_a_run_continues_its_record(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        store.start_run("r", "n", {"a": 1}, {}, {})
        store.log_metrics("r", [(1, -1, "loss", 1.0, 1.0)])
        store.finish_run("r", "preempted", {})
        started = store.run("r")["started"]
        store.start_run("r", "n", {"a": 2}, {}, {"world_size": 1})
        run = store.run("r")
        assert run["status"] == "running" and run["finished"] is None
        assert run["started"] == started and run["config"] == {"a": 2}
        assert len(store.metrics("r")) == 1
        assert store.events("r") == []  # the trainer records the resume, with its step


def test_trials_round_trip(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as store:
        store.log_trial("r", "t1", {"bucket_mb": 50}, "done", {"step_s": 0.1}, "keep")
        (trial,) = store.trials("r")
        assert trial["plan"] == {"bucket_mb": 50} and trial["figures"] == {"step_s": 0.1}
        assert trial["decision"] == "keep"


def _set_version(path: Path, version: int) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(version),))
    conn.close()


def test_concurrent_creation_makes_one_schema(tmp_path: Path) -> None:
    """Six connections create one new file at once, 30 times over (setting WAL mode used
    to fail at once with "database is locked" in about one round of ten)."""
    for round_ in range(30):
        path = tmp_path / f"runs{round_}.db"
        errors: list[BaseException] = []

        def open_and_write(i: int, path: Path = path, errors: list = errors) -> None:
            try:
                with RunStore(path) as s:
                    s.start_run(f"r{i}", "n", {}, {}, {})
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=open_and_write, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == [], round_
        with RunStore(path) as s:
            assert sorted(r["run_id"] for r in s.runs()) == [f"r{i}" for i in range(6)]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    RunStore(path).close()
    _set_version(path, store_mod.SCHEMA_VERSION + 1)
    with pytest.raises(StoreVersionError, match="newer than this tandem reads"):
        RunStore(path)


def test_older_schema_is_migrated_or_refused(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "runs.db"
    RunStore(path).close()
    _set_version(path, 0)
    with pytest.raises(StoreVersionError, match=f"cannot migrate to version "
                                                f"{store_mod.SCHEMA_VERSION}"):
        RunStore(path)
    seen: list[int] = []
    monkeypatch.setitem(store_mod.MIGRATIONS, 0, lambda conn: seen.append(0))
    RunStore(path).close()
    assert seen == [0]
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta").fetchone()[0] == str(store_mod.SCHEMA_VERSION)
    conn.close()


def test_version_1_trials_move_to_tune_trials(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        store.start_run("r", "r", {}, {}, {})
        store.log_trial("r", "t1", {"data.workers": 2}, "adopted", {"ratio": 2.0}, "faster")
    conn = sqlite3.connect(path)  # back to how version 1 stored it
    conn.execute("ALTER TABLE tune_trials RENAME TO trials")
    conn.commit()
    conn.close()
    _set_version(path, 1)
    with RunStore(path) as store:
        (trial,) = store.trials("r")
    assert trial["trial_id"] == "t1" and trial["figures"] == {"ratio": 2.0}


def test_version_2_gets_the_covering_index_and_keeps_its_rows(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "runs.db"
    with RunStore(path) as store:
        store.start_run("r", "r", {}, {}, {})
        store.log_metrics("r", [(10, -1, "loss", 1.5, 0.0), (20, 0, "loss", 1.2, 1.0)])
    conn = sqlite3.connect(path)  # back to how version 2 indexed the metrics
    conn.execute("DROP INDEX metrics_cover")
    conn.execute("CREATE INDEX metrics_run_name_step ON metrics (run_id, name, step)")
    conn.commit()
    conn.close()
    _set_version(path, 2)
    with caplog.at_level("WARNING", logger="tandem"), RunStore(path) as store:
        assert [m["value"] for m in store.metrics("r", name="loss")] == [1.5, 1.2]
    # a migration that can take minutes says so before it starts
    assert any("migrating schema version 2 to 3" in r.getMessage() for r in caplog.records)
    conn = sqlite3.connect(path)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    plan = " ".join(str(r) for r in conn.execute(
        "EXPLAIN QUERY PLAN SELECT step, rank, value, time FROM metrics WHERE run_id='r' "
        "AND name='loss' ORDER BY step"))
    conn.close()
    assert "metrics_cover" in indexes and "metrics_run_name_step" not in indexes
    assert "COVERING INDEX metrics_cover" in plan


def test_foreign_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreVersionError, match="not a tandem run store"):
        RunStore(path)


def test_environment_never_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # not a git checkout
    env = environment(world_size=3)
    assert env["git_commit"] is None and env["world_size"] == 3
    assert env["python"].startswith("3.") and env["host"]
    assert {"torch", "device", "platform"} <= set(env)


def test_writer_batches_by_count_and_close_drains(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_mod, "BATCH_SECONDS", 30.0)  # only the count triggers
    path = tmp_path / "runs.db"
    writer = StoreWriter(path, "r")
    for i in range(writer_mod.BATCH_ROWS - 1):
        writer.metric(i, 0, "loss", float(i))
    time.sleep(0.3)
    assert _count(path, "r") == 0
    writer.metric(999, 0, "loss", 1.0)
    assert _wait_for(lambda: _count(path, "r") == writer_mod.BATCH_ROWS)
    for i in range(10):
        writer.metric(1000 + i, -1, "lr", 0.1)
    writer.event(1005, -1, "loss-spike", "rose", value=3.0, threshold=2.0)
    writer.close()
    writer.close()  # idempotent
    assert _count(path, "r") == writer_mod.BATCH_ROWS + 10
    with RunStore(path) as reader:
        (event,) = reader.events("r")
    assert event["kind"] == "loss-spike" and event["threshold"] == 2.0
    writer.metric(2000, 0, "loss", 0.0)  # after close: dropped, not raised
    assert writer.dropped == 1


def test_writer_writes_on_time_and_flush(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_mod, "BATCH_SECONDS", 0.1)
    path = tmp_path / "runs.db"
    with StoreWriter(path, "r") as writer:
        writer.metric(1, 0, "loss", 1.0)
        assert _wait_for(lambda: _count(path, "r") == 1, timeout=5)
        monkeypatch.setattr(writer_mod, "BATCH_SECONDS", 30.0)
        writer.metric(2, 0, "loss", 2.0)
        assert writer.flush(timeout=10)
        assert _count(path, "r") == 2


def test_training_never_waits_on_a_locked_store(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_mod, "BATCH_SECONDS", 0.01)
    path = tmp_path / "runs.db"
    RunStore(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    writer = StoreWriter(path, "r")
    started = time.perf_counter()
    for i in range(2000):
        writer.metric(i, 0, "loss", 1.0)
    assert time.perf_counter() - started < 1.0
    time.sleep(0.2)
    assert _count(path, "r") == 0  # readers are not blocked by the lock (WAL)
    holder.execute("COMMIT")
    holder.close()
    writer.close()
    assert _count(path, "r") == 2000 and writer.dropped == 0


def test_writer_errors_are_logged_not_raised(tmp_path: Path,
                                             caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "a-directory"
    blocked.mkdir()  # sqlite cannot open a directory as its file
    with caplog.at_level(logging.ERROR, logger="tandem"):
        writer = StoreWriter(blocked, "r")
        writer.metric(1, 0, "loss", 1.0)
        writer.flush(timeout=10)
        writer.close()
    assert writer.dropped == 1 and "they are dropped" in caplog.text


READER = textwrap.dedent("""
    import importlib.util, sys, time
    # Load store.py by path: importing the tandem package would pull in torch (seconds).
    spec = importlib.util.spec_from_file_location("store", sys.argv[3])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    store = mod.RunStore(sys.argv[1])
    print("ready", flush=True)
    counts = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        counts.append(len(store.metrics("r")))
        if counts[-1] >= int(sys.argv[2]):
            break
        time.sleep(0.005)
    print(" ".join(map(str, counts)))
""")


def test_another_process_reads_while_the_writer_writes(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(writer_mod, "BATCH_SECONDS", 0.05)
    path = tmp_path / "runs.db"
    total = 3000
    with RunStore(path) as store:
        store.start_run("r", "live", {}, {}, {})
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(path), str(total), store_mod.__file__],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
    in_thread: list[int] = []

    def read_in_thread() -> None:  # a second connection, owned by another thread
        with RunStore(path) as mine:
            for _ in range(40):
                in_thread.append(len(mine.metrics("r")))
                time.sleep(0.02)

    thread = threading.Thread(target=read_in_thread)
    thread.start()
    writer = StoreWriter(path, "r")
    for i in range(total):
        writer.metric(i, i % 2, "time/step", 0.01)
        if i % 50 == 0:
            time.sleep(0.01)  # a training loop between logging windows
    writer.close()
    thread.join(10)
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    counts = [int(c) for c in out.split()]
    assert counts[-1] == total
    assert any(0 < c < total for c in counts)  # it did read while rows were coming in
    assert counts == sorted(counts)  # readers see whole transactions, never fewer rows
    assert in_thread == sorted(in_thread)
