"""The live scheduler on this machine: a resize, a preemption and a killed service lose
nothing (real `tandem run` process groups, sample ids checked against the global order)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tandem.sched.service.jobstore import SchedStore
from tests.faults.sched_env import SchedEnv, state_of, trained

SERVICE = ("--backend", "local", "--slots", "2", "--interval", "2", "--first-size", "1",
           "--restart-delay", "2", "--min-run", "5")
A_STEPS, B_STEPS, BATCH = 500, 30, 40  # the toy script's global batch


def _running_at(job_id: str, procs: int):  # noqa: ANN202 - a store check
    def check(store: SchedStore) -> bool:
        job = store.job(job_id)
        return job.state == "running" and job.procs == procs

    return check


@pytest.mark.timeout(360)
def test_resize_preemption_and_service_kill(tmp_path: Path) -> None:
    env = SchedEnv(tmp_path)
    try:
        a = env.submit("--train.steps", str(A_STEPS), "--procs", "1:2", "--name", "elastic")
        env.start_service(*SERVICE)
        # Started on 1 process (nothing measured yet); once measured, grown to 2.
        env.wait_for("the elastic job training on 1 process", trained(a, 1, env.store), 120)
        env.wait_for("the elastic job resized to 2", _running_at(a, 2), 60)
        env.wait_for("the resized job training", trained(a, 2, env.store), 120)
        before = {p.pid for p in env.job_processes()}
        env.kill_service()
        assert before and all(psutil.pid_exists(pid) for pid in before), \
            "the job's processes must outlive the service"
        env.start_service(*SERVICE)
        b = env.submit("--train.steps", str(B_STEPS), "--procs", "2", "--priority", "1",
                       "--name", "urgent")
        env.wait_for("the urgent job done", lambda s: state_of(b)(s) == "completed", 150)
        env.wait_for("the elastic job done", lambda s: state_of(a)(s) == "completed", 150)
        env.stop_service()
    finally:
        env.cleanup()
    with SchedStore(env.store) as store:
        runs_a, runs_b = store.attempts(a), store.attempts(b)
        resizes = {r["kind"]: r for r in store.resizes(a)}
    # a: 1 process, resized to 2, preempted for b, resumed; each stop a graceful one.
    assert [x.procs for x in runs_a[:2]] == [1, 2], runs_a
    assert [x.outcome for x in runs_a] == ["stopped", "stopped", "completed"], runs_a
    assert [x.outcome for x in runs_b] == ["completed"], runs_b
    # The restart adopted the running attempt: no attempt overlaps another of its job.
    for first, second in zip(runs_a, runs_a[1:], strict=False):
        assert first.ended is not None and first.ended <= second.launched
    assert runs_b[0].launched >= runs_a[1].ended - 1.0  # b waited for a's slots
    assert set(resizes) == {"resize", "preempt"}, resizes
    for row in resizes.values():
        assert row["steps_redone"] == 0, row
        assert row["training_again"] > row["decided"], row
    # Workers forked warm once the fork server listened, and none it could not fork.
    service_log = env.service_log.read_text(errors="replace")
    assert "fork server (pid" in service_log and "listening; first used" in service_log
    logs = "".join(p.read_text(errors="replace")
                   for p in (env.store.parent / "sched").glob("*/attempt-*/log.txt"))
    assert "starts cold" not in logs, logs[-3000:]
    # The data: every sample position once, in the global order, at 1 and 2 processes.
    for job_id, steps in ((a, A_STEPS), (b, B_STEPS)):
        found = env.audit(job_id)
        assert found.clean, (job_id, found)
        assert found.samples == steps * BATCH, (job_id, found)
