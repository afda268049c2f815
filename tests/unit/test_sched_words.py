"""How the scheduler names what it handles and why it stops a job, in words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.sched.backends.backend import describe
from tandem.sched.service.attempt import STOP_ENV, launcher_line, stop_words


@pytest.mark.parametrize(("handle", "said"), [
    ({"host": "node-3", "pid": 4321, "started": 1.5, "marker": "s:j1/1", "gpus": None},
     "pid 4321 on node-3"),
    ({"host": "node-3", "pid": 7, "started": None, "marker": "m", "gpus": [0, 2]},
     "pid 7 on node-3, GPUs 0,2"),
    ({"actor": "tandem-j4-2", "marker": "m", "bundle": 0}, "Ray actor tandem-j4-2"),
    ({"slurm_job": "8812", "marker": "m"}, "Slurm job 8812"),
    ({"engine": "x", "marker": "m"}, "engine x"),
])
def test_a_handle_is_described_without_its_internals(handle: dict, said: str) -> None:
    assert describe(handle) == said


def test_each_stop_is_named_for_what_it_was(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert stop_words({"reason": "cancel"}) == "cancelled (tandem cancel)"
    assert "preempted" in stop_words({"reason": "preempt"})
    assert stop_words({"reason": "resize", "to_procs": 4}).endswith("to 4 processes")
    assert stop_words(None) is None and stop_words({"reason": "other"}) is None
    monkeypatch.delenv(STOP_ENV, raising=False)
    assert launcher_line(12) is None  # not under the scheduler: the launcher's own line
    stop = tmp_path / "stop.json"
    monkeypatch.setenv(STOP_ENV, str(stop))
    assert launcher_line(12) is None  # the scheduler did not ask: someone else's SIGTERM
    stop.write_text(json.dumps({"reason": "cancel", "to_procs": 0}))
    line = launcher_line(12)
    assert line == ("tandem: cancelled (tandem cancel) at step 12; the checkpoint is "
                    "committed - it will not be resumed")
