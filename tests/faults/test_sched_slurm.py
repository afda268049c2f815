"""The scheduler on a real one-node Slurm: a job preempted (SIGTERM to its batch shell,
a committed checkpoint) and requeued, and its Slurm allocation set to each attempt's size."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tandem.sched.service.jobstore import SchedStore
from tests.faults.clusters import slurm_node
from tests.faults.sched_env import SchedEnv, state_of, trained

A_STEPS, B_STEPS, BATCH = 400, 40, 40


@pytest.mark.timeout(360)
def test_slurm_preemption_and_requeue(tmp_path: Path) -> None:
    with slurm_node(cpus=2) as slurm_env:
        env = SchedEnv(tmp_path, slurm_env)
        try:
            a = env.submit("--train.steps", str(A_STEPS), "--procs", "1:2", "--name", "long")
            env.start_service("--backend", "slurm", "--interval", "2", "--min-run", "5")
            env.wait_for("the long job training", trained(a, 1, env.store), 120)
            b = env.submit("--train.steps", str(B_STEPS), "--procs", "2", "--priority", "1",
                           "--name", "urgent")
            env.wait_for("the urgent job done", lambda s: state_of(b)(s) == "completed", 150)
            env.wait_for("the long job done", lambda s: state_of(a)(s) == "completed", 150)
            env.stop_service()
            with SchedStore(env.store) as store:
                runs_a, runs_b = store.attempts(a), store.attempts(b)
            slurm_job = runs_a[-1].handle["slurm_job"]
            shown = subprocess.run(["scontrol", "show", "job", "-o", slurm_job],
                                   env=env.env(), capture_output=True, text=True, timeout=30)
        finally:
            env.cleanup()
    assert [(x.outcome, x.stop_reason) for x in runs_a] == [("stopped", "preempt"),
                                                           ("completed", None)], runs_a
    assert [x.outcome for x in runs_b] == ["completed"], runs_b
    # One Slurm job for the whole tandem job, requeued once, at the size of its last attempt.
    assert {x.handle["slurm_job"] for x in runs_a} == {slurm_job}
    assert "Restarts=1" in shown.stdout, shown.stdout
    assert f"NumCPUs={runs_a[-1].procs}" in shown.stdout, shown.stdout
    for job_id, steps in ((a, A_STEPS), (b, B_STEPS)):
        found = env.audit(job_id)
        assert found.clean, (job_id, found)
        assert found.samples == steps * BATCH, (job_id, found)
