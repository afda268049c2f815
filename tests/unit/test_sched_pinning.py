"""Runs younger than min_run keep their slots; the inner policy shares out the rest."""

from __future__ import annotations

import pytest

from tandem.sched import Cluster, GoodputPolicy, JobSpec, JobView
from tandem.sched.policies.pinning import Pinned

CLUSTER = Cluster(nodes=1, slots_per_node=2)


def _job(job_id: str, submit: float, placement: tuple[int, ...] = (), service: float = 0.0,
         since: float | None = None) -> JobView:
    spec = JobSpec(job_id=job_id, submit_time=submit, min_procs=1, max_procs=1)
    return JobView(spec=spec, placement=placement, attained_service=service,
                   started=bool(placement), running_since=since)


def test_a_young_run_keeps_its_slot_an_old_one_yields_to_less_served_jobs() -> None:
    policy = Pinned(GoodputPolicy(), min_run=30.0)
    jobs = [_job("a", 0.0, (0,), service=80.0, since=60.0), _job("b", 50.0, (0,), 10.0, 90.0),
            _job("c", 95.0)]
    # At 100 s, a has trained 40 s since its start and 80 s in all (past the goodput
    # policy's first admission band, 60 s): least attained service wins, a yields to c; b
    # (10 s into its run) is pinned whatever its service.
    assert policy.allocate(jobs, CLUSTER, 100.0) == {"b": (0,), "c": (0,)}
    # At 80 s, a's run is 20 s old: it stays; b (not started yet at 90) is not pinned.
    early = [_job("a", 0.0, (0,), service=70.0, since=60.0), _job("b", 50.0), _job("c", 75.0)]
    assert policy.allocate(early, CLUSTER, 80.0) == {"a": (0,), "b": (0,)}
    # The inner policy alone would have preempted a at 80 s for the two unserved jobs.
    assert GoodputPolicy().allocate(early, CLUSTER, 80.0) == {"b": (0,), "c": (0,)}


def test_min_run_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="min_run"):
        Pinned(GoodputPolicy(), min_run=-1.0)
