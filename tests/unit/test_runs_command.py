"""`tandem runs` (filters, limit, delete), `tandem report` / `compare` (which run, where
the HTML goes), run kinds and their migration, and a stopped run's steps."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.monitor.recorder import Recorder
from tandem.monitor.store import RunStore
from tandem.trainer.progress import Reporter
from tandem.tune.trial import TrialRunner

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # whole run ids in the tables


def _add(store: RunStore, run_id: str, name: str, root: Path, status: str = "completed",
         steps: int = 0, kind: str = "user", folder: bool = True) -> None:
    """A run launched from `root` with run.dir `runs`; `steps` windows of loss rows."""
    config = {"run": {"dir": "runs", "kind": kind}}
    store.start_run(run_id, name, config, {}, {"cwd": str(root), "world_size": 1})
    store.log_metrics(run_id, [(s, -1, "loss", 1.0 / s, float(s))
                               for s in range(10, steps + 1, 10)])
    store.finish_run(run_id, status, {"steps": steps} if steps else {})
    if folder:
        (root / "runs" / name).mkdir(parents=True, exist_ok=True)
        (root / "runs" / name / "config.toml").write_text("[run]\n")


def _ids(out: str, *candidates: str) -> list[str]:
    return [c for c in candidates if c in out]


def test_report_by_name_picks_the_run_that_trained(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a refused resume an older store holds a newer 0-step 'failed' row of the
    same name: `report cc` and `report` mean the 700-step run."""
    db = tmp_path / "runs" / "tandem.db"
    with RunStore(db) as store:
        _add(store, "cc-trained", "cc", tmp_path, steps=700)
        _add(store, "cc-stub", "cc", tmp_path, status="failed", folder=False)
        store.log_event("cc-stub", 0, -1, "usage", "run.resume: refused")
        _add(store, "tune-001-candidate", "tune-001-candidate", tmp_path, steps=40,
             kind="trial")
        assert store.run("cc")["run_id"] == "cc-trained"
        assert store.latest_run()["run_id"] == "cc-trained"
    for argv in (["report", "cc"], ["report"]):
        assert main([*argv, "--store", str(db)]) == 0
        out = capsys.readouterr().out
        assert "(cc-trained)" in out and "700" in out and "cc-stub" not in out


def test_a_failed_runs_reason_is_in_the_text_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs" / "tandem.db"
    with RunStore(db) as store:
        _add(store, "boom", "boom", tmp_path, status="failed", steps=30)
        store.log_event("boom", 30, -1, "crash", "RuntimeError: shapes do not match")
    assert main(["report", "boom", "--store", str(db)]) == 0
    assert "failed at step 30: RuntimeError: shapes do not match" in capsys.readouterr().out


def test_report_and_compare_write_into_the_run_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "runs" / "tandem.db"
    with RunStore(db) as store:
        _add(store, "a-1", "a", tmp_path, steps=30)
        _add(store, "b-1", "b", tmp_path, steps=30)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", "a", "--store", str(db)]) == 0
    report = tmp_path / "runs" / "a" / "report.html"
    assert report.is_file() and f"report written to {report}" in capsys.readouterr().out
    assert main(["compare", "a", "b", "--store", str(db)]) == 0
    comparison = tmp_path / "runs" / "a" / "compare-with-b.html"
    assert comparison.is_file() and str(comparison) in capsys.readouterr().out
    assert main(["report", "b", "--store", str(db), "--out", str(tmp_path / "b.html")]) == 0
    assert (tmp_path / "b.html").is_file()
    assert list(elsewhere.iterdir()) == []  # nothing in the current folder


def _listed(capsys: pytest.CaptureFixture[str], db: Path, *flags: str) -> str:
    assert main(["runs", "--store", str(db), *flags]) == 0
    return capsys.readouterr().out


def test_runs_filters_by_name_status_and_kind_and_limits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs" / "tandem.db"
    ids = ("mnist-1", "mnist-2", "cifar-1", "tune-001-candidate", "tune-002-placebo")
    with RunStore(db) as store:
        _add(store, ids[0], "mnist", tmp_path, steps=100)
        _add(store, ids[1], "mnist", tmp_path, status="interrupted", steps=40)
        _add(store, ids[2], "cifar", tmp_path, status="failed", steps=20)
        _add(store, ids[3], ids[3], tmp_path, steps=40, kind="trial")
        _add(store, ids[4], ids[4], tmp_path, steps=40, kind="control")
    assert _ids(_listed(capsys, db), *ids) == list(ids[:3])  # user runs by default
    assert _ids(_listed(capsys, db, "--kind", "all"), *ids) == list(ids)
    assert _ids(_listed(capsys, db, "--kind", "trial"), *ids) == [ids[3]]
    assert _ids(_listed(capsys, db, "--name", "mni*"), *ids) == list(ids[:2])
    assert _ids(_listed(capsys, db, "--status", "failed"), *ids) == [ids[2]]
    limited = _listed(capsys, db, "--limit", "1")
    assert _ids(limited, *ids) == [ids[2]]  # the newest


def test_runs_delete_asks_and_removes_rows_and_folders(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "runs" / "tandem.db"
    with RunStore(db) as store:
        _add(store, "old-1", "old", tmp_path, status="failed", steps=10)
        _add(store, "keep-1", "keep", tmp_path, steps=10)
        _add(store, "keep-2", "keep", tmp_path, status="failed", steps=10)
    # no stdin to answer: refused, nothing deleted
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["runs", "--store", str(db), "--status", "failed", "--delete"]) == 1
    assert "nothing deleted" in capsys.readouterr().out
    with RunStore(db) as store:
        assert len(store.runs()) == 3
    # answered no: refused too
    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    assert main(["runs", "--store", str(db), "--status", "failed", "--delete"]) == 1
    # answered yes: the failed runs go; keep-2's folder stays, keep-1 still uses it
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    assert main(["runs", "--store", str(db), "--status", "failed", "--delete"]) == 0
    with RunStore(db) as store:
        assert [r["run_id"] for r in store.runs()] == ["keep-1"]
        assert store.metrics("old-1") == [] and store.events("old-1") == []
    assert not (tmp_path / "runs" / "old").exists()
    assert (tmp_path / "runs" / "keep").is_dir() and db.is_file()
    # --yes skips the question
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["runs", "--store", str(db), "--name", "keep", "--delete", "--yes"]) == 0
    assert not (tmp_path / "runs" / "keep").exists()
    with RunStore(db) as store:
        assert store.runs() == []


def test_runs_delete_needs_a_filter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs" / "tandem.db"
    with RunStore(db) as store:
        _add(store, "a-1", "a", tmp_path, steps=10)
    assert main(["runs", "--store", str(db), "--delete", "--yes"]) == 2
    assert "--delete needs --name, --status or --kind" in capsys.readouterr().err
    with RunStore(db) as store:
        assert len(store.runs()) == 1


def test_an_interrupted_run_records_its_steps(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "tandem.db"
    recorder = Recorder(db, "stopped-1", "stopped", {}, {}, "cpu", 1)
    reporter = Reporter(recorder, 100, 0, "off", active=True)
    reporter.close(None, "interrupted", 37)  # Ctrl-C at step 37: no summary
    with RunStore(db) as store:
        assert store.run("stopped-1")["summary"] == {"steps": 37}
    row = next(line for line in _listed(capsys, db).splitlines() if "stopped-1" in line)
    assert "interrupted" in row and " 37 " in row


def test_tuner_runs_are_marked_trial_or_control(tmp_path: Path) -> None:
    runner = TrialRunner(script="train.py", script_args=["--run.kind", "user"], nproc=1,
                         work_dir=tmp_path, store_path=tmp_path / "t.db")

    def kind(name: str, control: str) -> str:
        cmd = runner.command(name, tmp_path / "p.toml", 10, 5, control, [])
        assert cmd.count("--run.kind") == 1  # the script's own is dropped
        return cmd[cmd.index("--run.kind") + 1]

    assert kind("tune-001-candidate", "") == "trial"
    assert kind("tune-002-ref", "") == "trial"
    assert kind("tune-003-placebo", "") == "control"
    assert kind("validate-004-control", "no_comm") == "control"
    with RunStore(tmp_path / "t.db") as store:
        store.start_run("t", "t", {"run": {"kind": "trial"}}, {}, {})
        assert store.run("t")["kind"] == "trial"
        with pytest.raises(ValueError, match="run.kind 'robot'"):
            store.start_run("u", "u", {"run": {"kind": "robot"}}, {}, {})


def test_a_version_3_store_migrates_with_every_run_a_user_run(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    conn = sqlite3.connect(path)  # the runs table as version 3 made it
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema_version', '3');
        CREATE TABLE runs (run_id TEXT PRIMARY KEY, name TEXT NOT NULL, started REAL NOT NULL,
            finished REAL, status TEXT NOT NULL, config TEXT NOT NULL, plan TEXT NOT NULL,
            env TEXT NOT NULL, summary TEXT);
        INSERT INTO runs VALUES ('old', 'old', 1.0, 2.0, 'completed', '{}', '{}', '{}', '{}');
        CREATE TABLE metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL,
            rank INTEGER NOT NULL, name TEXT NOT NULL, value REAL, time REAL NOT NULL);
        CREATE TABLE events (run_id TEXT NOT NULL, step INTEGER NOT NULL, rank INTEGER NOT NULL,
            kind TEXT NOT NULL, message TEXT NOT NULL, value REAL, threshold REAL,
            time REAL NOT NULL);
        CREATE TABLE tune_trials (run_id TEXT NOT NULL, trial_id TEXT NOT NULL,
            plan TEXT NOT NULL, status TEXT NOT NULL, figures TEXT NOT NULL, decision TEXT,
            time REAL NOT NULL, PRIMARY KEY (run_id, trial_id));
    """)
    conn.close()
    with RunStore(path) as store:
        assert store.run("old")["kind"] == "user"
        assert [r["run_id"] for r in store.select_runs()] == ["old"]
