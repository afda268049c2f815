"""What the scheduler says: an adopted attempt in words, a cancelled job's log says
cancelled (real service, real `tandem run` job, a real `tandem cancel`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.faults.sched_env import SchedEnv, state_of, trained

SERVICE = ("--backend", "local", "--slots", "1", "--interval", "2")


@pytest.mark.timeout(420)
def test_an_adopted_attempt_and_a_cancelled_job_are_told_in_words(tmp_path: Path) -> None:
    env = SchedEnv(tmp_path)
    try:
        job = env.submit("--train.steps", "100000", "--procs", "1", "--name", "long")
        env.start_service(*SERVICE)
        env.wait_for("the job training", trained(job, 1, env.store), 180)
        env.kill_service()
        env.start_service(*SERVICE)  # finds the running attempt again
        env.wait_for("the attempt adopted", lambda _: "] adopted " in env.log(), 60)
        cancelled = env.tandem("cancel", job)
        assert cancelled.returncode == 0, cancelled.stderr
        env.wait_for("the job cancelled", lambda s: state_of(job)(s) == "cancelled", 180)
        env.stop_service()
        logs = env.tandem("logs", job)
    finally:
        env.cleanup()
    adopted = [line for line in env.log().splitlines() if "] adopted " in line]
    assert len(adopted) == 1, env.log()
    assert re.search(rf"adopted {job} attempt 1 \(pid \d+ on \S+\)$", adopted[0]), adopted
    assert "{" not in adopted[0] and "marker" not in adopted[0], adopted
    assert logs.returncode == 0, logs.stderr
    text = logs.stdout
    assert "tandem scheduler: cancelled (tandem cancel): stopping" in text, text[-3000:]
    assert re.search(r"tandem: cancelled \(tandem cancel\) at step \d+; the checkpoint is "
                     r"committed - it will not be resumed", text), text[-3000:]
    assert "preempt" not in text.lower(), text[-3000:]
