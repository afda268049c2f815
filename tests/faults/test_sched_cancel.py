"""What the scheduler says: an adopted attempt in words, a cancelled job's log and run say
cancelled (real service, real `tandem run` job, a real `tandem cancel`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tandem.monitor.store import RunStore
from tandem.sched.service.jobstore import SchedStore
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
        listed = env.tandem("runs", "--status", "cancelled")
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
    # The run is stored as cancelled, not preempted; its event keeps the kind the
    # scheduler's measurements read.
    with SchedStore(env.store) as sched:
        run_name = sched.job(job).run_name
    with RunStore(env.store) as runs:
        run = runs.run(run_name)
        kinds = [e["kind"] for e in runs.events(run["run_id"])]
    assert run["status"] == "cancelled", run["status"]
    assert "preempted" in kinds, kinds
    assert listed.returncode == 0, listed.stderr
    assert "cancelled" in listed.stdout and "preempted" not in listed.stdout, listed.stdout
