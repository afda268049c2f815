"""Which jobs' trials start warm (`tune.trial.warm_workers`): no processes started."""

from __future__ import annotations

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
