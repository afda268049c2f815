"""The scheduler on a real Ray cluster (a local head): placement-grouped jobs, a
preemption, and a killed actor whose job resumes from its checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.sched.service.jobstore import SchedStore
from tests.faults.clusters import ray_head
from tests.faults.sched_env import SchedEnv, state_of, trained

A_STEPS, B_STEPS, BATCH = 250, 150, 40


def _kill_actor(address: str, store: Path, job_id: str) -> None:
    import ray

    with SchedStore(store) as sched:
        (attempt,) = sched.attempts(job_id, open_only=True)
    ray.init(address=address, namespace="tandem", log_to_driver=False)
    try:
        ray.kill(ray.get_actor(attempt.handle["actor"], namespace="tandem"))
    finally:
        ray.shutdown()


@pytest.mark.timeout(360)
def test_ray_preemption_and_killed_actor(tmp_path: Path) -> None:
    with ray_head(cpus=1) as address:  # one slot: b preempts a
        env = SchedEnv(tmp_path)
        try:
            a = env.submit("--train.steps", str(A_STEPS), "--procs", "1", "--name", "long")
            env.start_service("--backend", "ray", "--ray-address", address, "--interval", "2",
                              "--min-run", "5")
            env.wait_for("the long job training", trained(a, 1, env.store), 120)
            b = env.submit("--train.steps", str(B_STEPS), "--procs", "1", "--priority", "1",
                           "--name", "urgent")
            env.wait_for("the urgent job training", trained(b, 1, env.store), 120)
            _kill_actor(address, env.store, b)
            env.wait_for("the urgent job done", lambda s: state_of(b)(s) == "completed", 150)
            env.wait_for("the long job done", lambda s: state_of(a)(s) == "completed", 150)
            env.stop_service()
        finally:
            env.cleanup()
    with SchedStore(env.store) as store:
        runs_a, runs_b = store.attempts(a), store.attempts(b)
        kinds_b = [r["kind"] for r in store.resizes(b)]
    # a: preempted for b (asked), resumed; b: its actor killed (not asked), resumed.
    assert [(x.outcome, x.stop_reason) for x in runs_a] == [("stopped", "preempt"),
                                                           ("completed", None)], runs_a
    assert [(x.outcome, x.stop_reason) for x in runs_b] == [("stopped", None),
                                                           ("completed", None)], runs_b
    assert kinds_b == ["recover"]
    for job_id, steps in ((a, A_STEPS), (b, B_STEPS)):
        found = env.audit(job_id)
        assert found.clean, (job_id, found)
        assert found.samples == steps * BATCH, (job_id, found)
