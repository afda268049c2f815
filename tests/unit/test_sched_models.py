"""Throughput, efficiency and goodput models: fits recover what generated the data."""

from __future__ import annotations

import pytest

from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.goodput import GoodputModel, split_batch
from tandem.sched.policies.job import BatchLimits
from tandem.sched.policies.throughput import StepSample, ThroughputModel

TRUE = dict(compute_const=0.02, compute_per_sample=0.003, intra_const=0.01,
            intra_per_proc=0.002, inter_const=0.05, inter_per_proc=0.004)


def _truth_step(nodes: int, procs: int, b: float) -> tuple[float, float]:
    compute = TRUE["compute_const"] + TRUE["compute_per_sample"] * b
    if procs == 1:
        sync = 0.0
    elif nodes == 1:
        sync = TRUE["intra_const"] + TRUE["intra_per_proc"] * (procs - 2)
    else:
        sync = TRUE["inter_const"] + TRUE["inter_per_proc"] * (procs - 2)
    return compute + sync, sync


def test_fit_recovers_known_parameters() -> None:
    samples = []
    for nodes, procs in [(1, 1), (1, 2), (1, 4), (2, 4), (2, 8), (4, 16)]:
        for b in (8, 16, 32):
            step, sync = _truth_step(nodes, procs, b)
            samples.append(StepSample(nodes, procs, b, step, sync))
    model = ThroughputModel.fit(samples)
    for name, value in TRUE.items():
        assert getattr(model, name) == pytest.approx(value, rel=1e-6), name
    step, _ = _truth_step(3, 12, 24)  # a size never measured
    assert model.step_time(3, 12, 24) == pytest.approx(step, rel=1e-6)


def test_fit_with_accumulation_counts_compute_per_micro_batch() -> None:
    samples = [StepSample(n, r, b, *_truth_step(n, r, b))
               for n, r in [(1, 1), (1, 2), (1, 3), (2, 4), (2, 6)] for b in (4, 12)]
    model = ThroughputModel.fit(samples)
    compute = TRUE["compute_const"] + TRUE["compute_per_sample"] * 12
    sync = TRUE["inter_const"] + TRUE["inter_per_proc"] * 4
    assert model.step_time(2, 6, 12, accum_steps=2) == pytest.approx(3 * compute + sync)


def test_fit_priors_when_links_unmeasured() -> None:
    one = [StepSample(1, 1, 16, *_truth_step(1, 1, 16))]
    model = ThroughputModel.fit(one)
    assert model.sync_time(2, 8) == 0.0  # nothing measured: assumed free
    assert model.compute_time(16) == pytest.approx(_truth_step(1, 1, 16)[0])
    intra = one + [StepSample(1, 2, 16, *_truth_step(1, 2, 16))]
    model = ThroughputModel.fit(intra)
    assert model.sync_time(2, 2) == pytest.approx(1.1 * TRUE["intra_const"])


def test_fit_rejects_bad_measurements() -> None:
    with pytest.raises(ValueError, match="samples"):
        ThroughputModel.fit([])
    with pytest.raises(ValueError, match="step_time"):
        ThroughputModel.fit([StepSample(1, 1, 8, 0.0, 0.0)])


def test_efficiency_matches_the_noise_scale_step_law() -> None:
    # McCandlish et al.: steps to a target S(B) = S_min (1 + B_noise / B).
    grad_sqr, grad_var, base = 2.0, 6.0, 32
    model = EfficiencyModel.from_gradient_stats(grad_sqr, grad_var, base)
    noise = base * grad_var / grad_sqr
    assert model.noise_scale == pytest.approx(noise)

    def steps(b: float) -> float:
        return 1 + noise / b

    for batch in (32, 64, 256, 4096):
        gain = steps(base) / steps(batch)  # base-batch steps saved per step at `batch`
        assert model.efficiency(batch) == pytest.approx(gain * base / batch)
    assert model.efficiency(base) == 1.0
    assert EfficiencyModel.from_gradient_stats(0.0, 1.0, 8).efficiency(1024) == 1.0


def test_split_batch_by_hand() -> None:
    assert split_batch(2048, 6, BatchLimits(min_local=32, max_local=1024)) == (342, 0)
    assert split_batch(384, 16, BatchLimits(min_local=4, max_local=12)) == (12, 1)
    assert split_batch(64, 4, BatchLimits(min_local=4, max_local=8)) == (8, 1)


def test_best_batch_near_brute_force_and_consistent() -> None:
    throughput = ThroughputModel(**TRUE)
    efficiency = EfficiencyModel(noise_scale=500.0, base_batch=16)
    limits = BatchLimits(min_local=4, max_local=64, max_batch=2048)
    model = GoodputModel(throughput, efficiency, limits)
    for nodes, procs in [(1, 1), (1, 4), (2, 8), (4, 16)]:
        best = model.best(nodes, procs)
        assert best.goodput == pytest.approx(
            model.evaluate(nodes, procs, best.local_bsz, best.accum_steps))
        brute = max(model.evaluate(nodes, procs, *split_batch(b, procs, limits))
                    for b in range(max(16, 4 * procs), 2049))
        assert brute * 0.98 <= best.goodput <= brute * (1 + 1e-9)
    fixed = GoodputModel(throughput, efficiency, limits, adapt_batch=False)
    assert fixed.best(1, 4).batch == 16
