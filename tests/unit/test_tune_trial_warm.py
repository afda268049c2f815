"""Which jobs' trials start warm (`tune.trial.warm_workers`): no processes started."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tandem.tune.trial import TrialRunner, threads_per_process, warm_workers


@pytest.mark.parametrize("value, threads", [("4", 4), ("1", 1), ("", 1), ("x", 1)])
def test_a_multi_threaded_job_starts_its_trials_cold(tmp_path: Path, value: str,
                                                     threads: int) -> None:
    runner = TrialRunner("job.py", [], 2, tmp_path, tmp_path / "s.db",
                         env={"OMP_NUM_THREADS": value})
    assert threads_per_process(runner) == threads
    if threads > 1:  # no fork server: a forked worker would not start with 4 threads
        with warm_workers(runner):
            assert runner.forkserver is None
    with warm_workers(runner, enabled=False):
        assert runner.forkserver is None


def test_a_run_waits_for_the_fork_server_still_importing_not_for_one_that_is_gone(
        tmp_path: Path) -> None:
    from tandem.sched.backends.local_backend import ForkServer

    runner = TrialRunner("job.py", [], 2, tmp_path, tmp_path / "s.db")
    server = ForkServer()
    runner.forkserver = server
    try:
        # just started: it is still importing torch; the run waits until it listens
        assert runner._server_ready()
        assert server.ready()
    finally:
        server.close()
    server.process.wait(timeout=60)
    started = time.monotonic()
    assert not runner._server_ready()  # gone: the run starts cold at once
    assert time.monotonic() - started < 5.0
