"""Every table the CLI prints is readable at 80 columns: no line wider, no cell cut to
`…`, and the columns that identify a row and say how it went are all there."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest
from rich.console import Console

from tandem.analyze.report.run_report import print_summary
from tandem.analyze.synthetic import Synthetic, write_synthetic
from tandem.cli import _compare, _list_runs
from tandem.monitor.store import RunStore
from tandem.sched.service.jobs_cli import queue, submit_main
from tandem.sched.service.jobstore import SchedStore
from tandem.tables import print_fitted
from tandem.tune.common import decision_table
from tandem.tune.outcome import Record

WIDTH = 80
NAMES = ["mnist-cnn-baseline", "mnist-cnn-fsdp-bucket", "resnet18-cifar10-ddp",
         "mnist-cnn-inmemory"]
IDS = [f"{name}-20261204-1635{i:02d}-ab{i}f" for i, name in enumerate(NAMES)]
NOTE = ("resuming from its checkpoint after: attempt 2 exited 1: RuntimeError: Gloo "
        "connectFullMesh failed")


def _runs_args(store: Path) -> argparse.Namespace:
    """`tandem runs` with no filter, as its parser gives it."""
    return argparse.Namespace(store=str(store), name=None, status=None, kind="all",
                              limit=None, delete=False, yes=False)


def _console(width: int = WIDTH) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, color_system=None, force_terminal=False), out


def _readable(text: str, *whole: str) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, text
    assert "…" not in text, text
    for part in whole:
        assert part in text, (part, text)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "tandem.db"
    with RunStore(path) as runs:
        for i, (run_id, name) in enumerate(zip(IDS, NAMES, strict=True)):
            write_synthetic(runs, run_id, name, Synthetic(steps=100 + i, world_size=2,
                                                          seed=i))
        runs.start_run("tune-1", "tune-toy", {"script": "toy.py"}, {}, {"world_size": 2})
        runs.log_trial("tune-1", "01", {"plan.comm_hook": "none"}, "bound",
                       {"label": "no gradient communication", "kind": "control",
                        "ratio": {"estimate": 1.02, "low": 0.98, "high": 1.04, "n": 8}},
                       "even removing all communication gains only 1.04x: skipped")
        runs.log_trial("tune-1", "02", {"data.workers": 2}, "adopted",
                       {"label": "data.workers 2", "kind": "candidate",
                        "ratio": {"estimate": 1.31, "low": 1.22, "high": 1.40, "n": 8}},
                       "adopted: 1.31x [1.22, 1.40] against a placebo floor of 1.17x")
        runs.finish_run("tune-1", "completed", {})
    return path


def test_runs_at_80_columns(store: Path) -> None:
    console, out = _console()
    _list_runs(_runs_args(store), console)
    _readable(out.getvalue(), *IDS, "status", "steps", "final loss", "completed")


def test_compare_at_80_columns(store: Path, tmp_path: Path) -> None:
    console, out = _console()
    _compare(argparse.Namespace(store=str(store), runs=NAMES, out=str(tmp_path / "c.html")),
             console)
    text = out.getvalue()
    _readable(text, "final loss", "samples/s vs first run", "step time", *NAMES)
    for stamp in (i.split("-", 3)[-1] for i in IDS):  # each run told apart in the legend
        assert stamp[-4:] in text, (stamp, text)


def test_tuning_decisions_at_80_columns(store: Path) -> None:
    console, out = _console()
    with RunStore(store) as runs:
        print_summary(runs, "tune-1", console)
    _readable(out.getvalue(), "data.workers 2", "bound", "1.31x [1.22, 1.4]",
              "02: adopted: 1.31x [1.22, 1.40] against a placebo floor of 1.17x")
    rate = {"estimate": 1210.0, "low": 1150.0, "high": 1270.0, "n": 8}
    records = [Record(trial_id="03", label="train.micro_batch 64", kind="candidate",
                      status="rejected", changes={"train.micro_batch": 64},
                      figures={"samples_per_s": rate},
                      decision="rejected: 0.97x [0.91, 1.02] is inside the noise floor")]
    console, out = _console()
    print_fitted(console, decision_table(records, "tune session t"), spill=("decision",))
    _readable(out.getvalue(), "train.micro_batch 64", "rejected",
              "03: rejected: 0.97x [0.91, 1.02] is inside the noise floor")


def test_the_job_queue_at_80_columns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sched.db"
    monkeypatch.setenv("TANDEM_STORE", str(path))
    (tmp_path / "train.py").write_text("")
    monkeypatch.chdir(tmp_path)
    for name in NAMES[:2]:
        assert submit_main(["train.py", "--procs", "1:4", "--name", name]) == 0
    with SchedStore(path) as store:
        store.update_job("j2", ("queued",), message=NOTE)
    console, out = _console()
    queue(path, True, console)
    _readable(out.getvalue(), "j1", "j2", *NAMES[:2], "queued", "procs", "samples/s",
              "connectFullMesh failed")


def test_a_wide_console_keeps_every_column(store: Path) -> None:
    console, out = _console(200)
    _list_runs(_runs_args(store), console)
    text = out.getvalue()
    assert all(column in text for column in ("started", "name", "world", "final loss"))


def test_a_decision_holding_brackets_prints_as_written() -> None:
    # A failed trial's message quotes gloo's "[/__w/.../pair.cc:537]": text, not markup
    # (rich read it as a closing tag and the whole session ended in a MarkupError).
    from tandem.tune.outcome import Record

    message = "a run failed: [/__w/pytorch/gloo/pair.cc:537] Read error [127.0.0.1]:1"
    record = Record("t-001", "placebo", "placebo", "failed", {}, {}, message)
    console = Console(width=400, record=True)
    console.print(decision_table([record], "session"))
    assert message in console.export_text()
