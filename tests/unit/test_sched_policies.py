"""Policies on small hand-built scenarios, against allocations worked out independently."""

from __future__ import annotations

import pytest

from tandem.sched import (
    BatchLimits,
    Cluster,
    EfficiencyModel,
    FIFOPolicy,
    GoodputPolicy,
    JobSpec,
    JobView,
    ThroughputModel,
    TiresiasPolicy,
    simulate,
)
from tandem.sched.simulation.measured_app import MeasuredApplication

LIMITS = BatchLimits(min_local=1, max_local=1024, max_batch=4096)


def rigid(job_id: str, submit: float, procs: int, placement: tuple[int, ...] = (),
          service: float = 0.0) -> JobView:
    spec = JobSpec(job_id=job_id, submit_time=submit, min_procs=procs, max_procs=procs)
    return JobView(spec=spec, placement=placement, attained_service=service,
                   started=bool(placement))


def test_fifo_never_preempts_and_keeps_order() -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    late_running = rigid("late", 50.0, 3, placement=(0, 0, 0))
    early_waiting = rigid("early", 0.0, 2)
    small = rigid("small", 60.0, 1)
    out = FIFOPolicy().allocate([early_waiting, late_running, small], cluster, 100.0)
    # the running job keeps its slots; "early" (2) does not fit in the 1 free slot and,
    # strictly first in line, holds back "small" which would fit.
    assert out == {"late": (0, 0, 0)}
    out = FIFOPolicy(backfill=True).allocate([early_waiting, late_running, small], cluster, 0)
    assert out == {"late": (0, 0, 0), "small": (0,)}


def test_fifo_starts_in_submission_order() -> None:
    cluster = Cluster(nodes=2, slots_per_node=2)
    jobs = [rigid("c", 3.0, 2), rigid("a", 1.0, 2), rigid("b", 2.0, 2)]
    out = FIFOPolicy().allocate(jobs, cluster, 10.0)
    assert set(out) == {"a", "b"}
    assert sorted(out["a"] + out["b"]) == [0, 0, 1, 1]


def test_tiresias_demotes_the_job_with_most_attained_service() -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    policy = TiresiasPolicy(thresholds=(1000.0,))
    # "old" came first and runs, but has passed the threshold: the two fresh jobs
    # (queue 0) take the cluster and "old" is preempted.
    old = rigid("old", 0.0, 2, placement=(0, 0), service=1500.0)
    fresh1 = rigid("fresh1", 10.0, 2, service=0.0)
    fresh2 = rigid("fresh2", 20.0, 2, placement=(0, 0), service=400.0)
    assert policy.queue(old) == 1 and policy.queue(fresh1) == 0
    out = policy.allocate([old, fresh1, fresh2], cluster, 100.0)
    assert set(out) == {"fresh1", "fresh2"}
    # below the threshold nobody is demoted: FIFO inside queue 0, so "old" stays.
    calm = TiresiasPolicy(thresholds=(10_000.0,))
    out = calm.allocate([old, fresh1, fresh2], cluster, 100.0)
    assert out == {"old": (0, 0), "fresh1": (0, 0)}  # "old" keeps its slots


def test_tiresias_skips_a_job_that_does_not_fit() -> None:
    cluster = Cluster(nodes=2, slots_per_node=2)
    big = rigid("big", 0.0, 3, placement=(0, 0, 1), service=10_000.0)  # queue 1
    first = rigid("first", 5.0, 2)
    wide = rigid("wide", 6.0, 3)  # cannot fit after "first"
    tiny = rigid("tiny", 7.0, 1)
    out = TiresiasPolicy(thresholds=(100.0,)).allocate([big, first, wide, tiny], cluster, 0)
    assert set(out) == {"first", "tiny"}
    assert sorted(out["first"] + out["tiny"]) == [0, 0, 1]  # most free node first


def _model(sync_const: float) -> ThroughputModel:
    return ThroughputModel(compute_const=0.01, compute_per_sample=0.001,
                           intra_const=sync_const, intra_per_proc=0.0,
                           inter_const=sync_const * 2, inter_per_proc=0.0)


def _goodput(model: ThroughputModel, procs: int, batch: int = 256) -> float:
    """Fixed-batch goodput on one node by the model formula (efficiency 1 at the base)."""
    local = batch / procs
    return batch / (model.compute_const + model.compute_per_sample * local
                    + model.sync_time(1, procs))


def elastic(job_id: str, model: ThroughputModel, *, size: int = 0, submit: float = 0.0,
            max_procs: int = 4) -> JobView:
    spec = JobSpec(job_id=job_id, submit_time=submit, min_procs=1, max_procs=max_procs,
                   batch_size=256, adapt_batch=False, limits=LIMITS)
    return JobView(spec=spec, placement=(0,) * size, started=bool(size), throughput=model,
                   efficiency=EfficiencyModel(noise_scale=1000.0, base_batch=256),
                   max_measured_procs=2, restart_delay=0.0)


@pytest.mark.parametrize("order", [0, 1])
def test_goodput_gives_the_slot_to_the_larger_gain(order: int) -> None:
    cluster = Cluster(nodes=1, slots_per_node=3)
    cheap, costly = _model(0.005), _model(0.08)
    jobs = [elastic("cheap", cheap), elastic("costly", costly)]
    jobs = jobs if order == 0 else jobs[::-1]
    # plain sum of speedups (fairness 1): with one slot each at the fair share (3 // 2 = 1),
    # the third slot is worth g(2) / g(1) - 1 to each job.
    gain = {j.job_id: _goodput(j.throughput, 2) / _goodput(j.throughput, 1) - 1 for j in jobs}
    winner = max(gain, key=gain.get)
    assert gain["cheap"] != pytest.approx(gain["costly"], rel=0.05)
    out = GoodputPolicy(fairness=1.0).allocate(jobs, cluster, 0.0)
    assert {k: len(v) for k, v in out.items()} == {
        winner: 2, ({"cheap", "costly"} - {winner}).pop(): 1}


@pytest.mark.parametrize("sync_const", [0.002, 0.05, 0.2])
def test_goodput_resizes_only_when_the_gain_pays_the_restart(sync_const: float) -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    model = _model(sync_const)
    job = elastic("a", model, size=2, max_procs=4)
    job = JobView(**{**job.__dict__, "restart_delay": 40.0})
    now, age = 100.0, 100.0  # submitted at 0: the horizon is its age, 100 s
    keep = (age - 40.0) / age
    grows = keep * max(_goodput(model, 3), _goodput(model, 4)) > _goodput(model, 2)
    out = GoodputPolicy().allocate([job], cluster, now)
    assert len(out["a"]) == (4 if grows and _goodput(model, 4) >= _goodput(model, 3)
                             else 3 if grows else 2)
    if not grows:
        assert out["a"] == (0, 0)  # untouched: no restart


def test_goodput_without_restart_cost_takes_the_best_size() -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    model = _model(0.002)
    job = elastic("a", model, size=2, max_procs=4)
    best = max(range(1, 5), key=lambda r: _goodput(model, r))
    assert len(GoodputPolicy().allocate([job], cluster, 1e9)["a"]) == best


def test_goodput_admits_by_bands_of_attained_service() -> None:
    policy = GoodputPolicy(las_band=60.0)
    assert [policy.band(s) for s in (0, 59.9, 60, 119.9, 120, 239.9, 240, 480)] == [
        0, 0, 1, 1, 2, 2, 3, 4]
    cluster = Cluster(nodes=1, slots_per_node=1)
    # inside one band (60..120) the earlier submission keeps the slot, whatever its service
    older = rigid("older", 0.0, 1, (0,), service=110.0)
    newer = rigid("newer", 5.0, 1, service=70.0)
    assert policy.allocate([older, newer], cluster, 200.0) == {"older": (0,)}
    # a job with less than half the service (an earlier band) displaces it
    fresh = rigid("fresh", 9.0, 1, service=50.0)
    assert policy.allocate([older, fresh], cluster, 200.0) == {"fresh": (0,)}


def test_goodput_does_not_preempt_a_job_with_less_left_than_a_restart() -> None:
    policy = GoodputPolicy(las_band=60.0)
    cluster = Cluster(nodes=1, slots_per_node=1)
    spec = JobSpec(job_id="old", submit_time=0.0, min_procs=1, max_procs=1)
    fresh = rigid("fresh", 9.0, 1, service=0.0)

    def old(progress: float) -> JobView:
        return JobView(spec=spec, placement=(0,), attained_service=130.0, started=True,
                       restart_delay=5.0, progress=progress)

    # 130 s done at 98%: 130 * 0.02 / 0.98 = 2.65 s left, less than its 5 s restart
    assert old(0.98).remaining() == pytest.approx(130 * 0.02 / 0.98)
    assert policy.allocate([old(0.98), fresh], cluster, 200.0) == {"old": (0,)}
    # at 90% it has 14.4 s left: LAS's bands decide, and the fresh job takes the slot
    assert policy.allocate([old(0.90), fresh], cluster, 200.0) == {"fresh": (0,)}
    # progress unknown: as before, by bands
    assert policy.allocate([old(0.0), fresh], cluster, 200.0) == {"fresh": (0,)}


def test_goodput_admission_does_not_swap_jobs_whose_services_cross() -> None:
    # Two equal rigid jobs share one slot, decided every 2 s with nothing pinned: compared
    # exactly, their services keep crossing (16-18 swaps with las_band 1 s or less); in
    # doubling bands the slot changes hands at most twice per band (each job crossing into
    # the next band once).
    apps = {"a": MeasuredApplication("a", 1, 300, {1: 1.0})}  # 300 s of work each
    specs = [JobSpec(job_id=n, submit_time=0.0, min_procs=1, max_procs=1, batch_size=1,
                     limits=apps["a"].limits, application="a") for n in ("x", "y")]
    result = simulate(specs, apps, GoodputPolicy(las_band=60.0),
                      Cluster(nodes=1, slots_per_node=1), interval=2.0, restart_delay=1.0)
    bands = 4  # a job's 300 s of service passes through [0, 60), [60, 120), [120, 240), [240, 480)
    assert set(result.jcts) == {"x", "y"}
    assert 1 <= result.restarts <= 2 * bands
    assert result.makespan >= 600.0 + result.restarts * 1.0


def test_policies_are_pure_and_deterministic() -> None:
    cluster = Cluster(nodes=2, slots_per_node=4)
    jobs = [elastic("a", _model(0.01), size=2), elastic("b", _model(0.05), submit=5.0),
            elastic("c", _model(0.001), submit=9.0)]
    before = [j.__dict__.copy() for j in jobs]
    for policy in (GoodputPolicy(), TiresiasPolicy(), FIFOPolicy()):
        if policy.name != "goodput":
            views = [rigid(j.job_id, j.spec.submit_time, 2, j.placement) for j in jobs]
        else:
            views = jobs
        first = policy.allocate(views, cluster, 500.0)
        again = policy.allocate(list(views), cluster, 500.0)
        assert first == again
    assert [j.__dict__ for j in jobs] == before


def test_goodput_keeps_the_size_of_a_job_that_no_resize_pays_for() -> None:
    # An elastic job whose restarts cost more than any horizon (keep() is 0) holds 2 of 4
    # slots and may grow to 4: admission gives it 1, growth must give its 2 back, not
    # stop at sizes whose utility is -inf on both sides.
    policy = GoodputPolicy()
    cluster = Cluster(nodes=1, slots_per_node=4)
    job = elastic("near", _model(0.01), size=2)
    near = JobView(spec=job.spec, placement=(0, 0), attained_service=200.0, started=True,
                   restart_delay=600.0, throughput=job.throughput,
                   efficiency=job.efficiency, max_measured_procs=2)
    assert policy.keep(near, 500.0) == 0.0
    assert policy.allocate([near], cluster, 500.0) == {"near": (0, 0)}
