"""The search space sized from measurements, against hand computations."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tandem.config import load
from tandem.tune import measure, sizing, space
from tandem.tune.stats import WindowFigure

BASE = space.flatten(load().to_dict())
GIB = 2.0 ** 30
MIB = 2.0 ** 20


def _m(config: dict[str, Any] | None = None, **figures: Any) -> measure.Measured:
    summary = figures.pop("summary", {"micro_batch": 64, "accumulation": 1})
    defaults: dict[str, Any] = dict(world=2, cpus=2, config={**BASE, **(config or {})},
                                    summary=summary, threads=1, step_s=0.1,
                                    compute_s=0.05, data_s=0.0, log_every=5)
    return measure.Measured(**{**defaults, **figures})


def test_needless_accumulation_gets_the_largest_micro_batch_memory_allows() -> None:
    m = _m({"train.global_batch": 128, "train.micro_batch": 4},
           summary={"micro_batch": 4, "accumulation": 16}, rss_bytes=0.5 * GIB,
           available_bytes=20 * GIB)
    cands = sizing.micro_batch(m, fixed_bytes=0.4 * GIB)
    assert [c.changes for c in cands] == [{"train.micro_batch": 64}]
    assert cands[0].lossy and "16 accumulation passes" in cands[0].reason
    # 2 ranks x (0.4 + k x 0.1) GiB under 80% of 2 GiB: k <= 4, micro-batch 16
    tight = _m(m.config, summary=m.summary, rss_bytes=0.5 * GIB, available_bytes=2 * GIB)
    assert sizing.micro_batch(tight, fixed_bytes=0.4 * GIB)[0].changes == {
        "train.micro_batch": 16}
    none_fits = _m(m.config, summary=m.summary, rss_bytes=0.5 * GIB, available_bytes=GIB)
    assert sizing.micro_batch(none_fits, fixed_bytes=0.4 * GIB) == []
    assert sizing.micro_batch(_m(rss_bytes=GIB, available_bytes=20 * GIB)) == []  # accum 1


def test_micro_batch_on_a_gpu_uses_the_activation_part_of_the_peak() -> None:
    m = _m({"train.global_batch": 64, "train.micro_batch": 8},
           summary={"micro_batch": 8, "accumulation": 4}, cuda_peak=30 * GIB,
           cuda_total=80 * GIB, cuda_allocated=10 * GIB)
    # held 10 + k x 20 <= 64 GiB: k <= 2.7, so 16 (k = 2), not 32 (k = 4)
    assert sizing.micro_batch(m)[0].changes == {"train.micro_batch": 16}


def test_oversubscribed_threads_come_down_to_the_cores() -> None:
    cands = sizing.threads(_m(threads=4))
    assert [c.changes for c in cands] == [{"plan.threads": 1}]
    assert "oversubscribed" in cands[0].reason and not cands[0].lossy
    assert sizing.threads(_m(threads=1)) == []
    idle = _m(world=1, cpus=4, threads=1, compute_s=0.09)
    assert sizing.threads(idle)[0].changes == {"plan.threads": 4}


def test_a_costly_cadence_is_spaced_out_to_one_percent() -> None:
    m = _m({"train.eval_every": 2}, eval_s=0.05, log_s=0.0005)
    cands = sizing.cadence(m)
    # 25 ms per step of evaluation on a 100 ms step: every ceil(0.05 / 0.001) = 50 steps
    assert [c.changes for c in cands] == [{"train.eval_every": 50}]
    wall = 0.1 + 0.0005 / 5 + 0.025
    assert cands[0].predicted == pytest.approx(wall / (wall - 0.025 + 0.001))
    logging = _m({"monitor.log_every": 1}, log_s=0.02, log_every=1)
    assert sizing.cadence(logging)[0].changes == {"monitor.log_every": 20}
    # the trials logged every 5 steps while the job logs every 100: not the job's cost
    assert sizing.cadence(_m({"monitor.log_every": 100}, log_s=0.02, log_every=5)) == []
    assert sizing.cadence(_m({"train.eval_every": 100}, eval_s=0.05)) == []  # 0.5%


def test_checkpoint_cadence_stays_a_multiple_of_the_meetings() -> None:
    m = _m({"checkpoint.every": 8, "plan.strategy": "localsgd", "plan.sync_every": 8},
           checkpoint_s=0.08)
    # 10 ms per step of a 100 ms step; 1% at 80 steps -> 100 (1-2-5) -> 13 x 8
    assert sizing.cadence(m)[0].changes == {"checkpoint.every": 104}


def test_data_workers_hide_the_measured_loading_time() -> None:
    m = _m(step_s=0.042, data_s=0.032, cpus=8)
    cands = sizing.data_workers(m)
    # 32 ms of loading behind 10 ms of the rest: ceil(3.2) + 1 = 5 workers; 3 free cores
    assert [c.changes for c in cands] == [{"data.workers": 5}, {"data.workers": 3}]
    assert cands[0].predicted == pytest.approx(4.2)
    small = _m(step_s=0.042, data_s=0.032, cpus=2)  # at most 4 per core / 2 ranks = 4
    assert [c.changes for c in sizing.data_workers(small)] == [{"data.workers": 4},
                                                               {"data.workers": 1}]
    assert sizing.data_workers(_m(step_s=0.1, data_s=0.005)) == []


def test_a_bucket_is_proposed_only_when_latency_bound_and_worth_it() -> None:
    link = dict(latency_s=0.4e-3, bandwidth=GIB, step_s=0.2)
    wide = _m({"plan.bucket_mb": 0.05}, grad_bytes=16 * MIB, buckets=330, **link)
    cands = sizing.bucket(wide, 0.05)
    new = math.ceil(8 * 0.4e-3 * GIB / MIB * 10) / 10  # 8 x latency x bandwidth
    assert [c.changes for c in cands] == [{"plan.bucket_mb": new}]
    saved = (330 - (math.ceil(16 / new) + 1)) * 0.4e-3
    assert cands[0].predicted == pytest.approx(0.2 / (0.2 - saved))
    # a model that fits one bucket: a bucket size cannot matter, never proposed
    assert sizing.bucket(_m({"plan.bucket_mb": 25.0}, grad_bytes=90e3, buckets=1, **link),
                         0.05) == []
    # buckets already far above latency x bandwidth
    assert sizing.bucket(_m({"plan.bucket_mb": 25.0}, grad_bytes=400 * MIB, buckets=17,
                            **link), 0.05) == []
    assert sizing.bucket(_m({"plan.bucket_mb": 0.05}, grad_bytes=16 * MIB, buckets=330,
                            world=1, **link), 0.05) == []
    # a calibrated latency x all-reduces beyond the whole step: the prediction is capped
    slow_link = dict(latency_s=12e-3, bandwidth=400 * MIB, step_s=1.2)
    capped = sizing.bucket(_m({"plan.bucket_mb": 0.02}, grad_bytes=12 * MIB, buckets=192,
                              **slow_link), 0.05)
    assert capped and capped[0].predicted == pytest.approx(1 / (1 - sizing.MAX_SAVED_SHARE))


def test_static_graph_with_accumulation_is_refused() -> None:
    cfg = {**BASE, "train.global_batch": 128, "train.micro_batch": 4}
    problem = space.check(cfg, {"plan.static_graph": True}, world=2)
    assert problem and "static_graph" in problem
    assert space.check({**cfg, "train.micro_batch": 64}, {"plan.static_graph": True}, 2) is None
    assert "comm_hook" in space.check(BASE, {"plan.strategy": "fsdp",
                                             "plan.comm_hook": "fp16"})
    assert space.comm_remedies(cfg, "r", 2, None) and not any(
        "plan.static_graph" in c.changes for c in space.comm_remedies(cfg, "r", 2, None))


def test_cadence_costs_from_window_gaps() -> None:
    """Windows of 5 steps, 50 ms of training each; 2 ms to close a window; an evaluation
    of 30 ms after steps 10 and 20; a 12 ms checkpoint after step 15."""
    evals, ckpts = {10: 0.03, 20: 0.03}, {15: 0.012}
    windows, t = [], 0.0
    for i in range(1, 7):
        start, end = (i - 1) * 5, i * 5
        t += 0.05 + 0.002 + sum(v for s, v in {**evals, **ckpts}.items() if start <= s < end)
        windows.append(WindowFigure(end, 160, 0.05, t))
    config = {"train.eval_every": 10, "checkpoint.every": 15}
    costs = measure.cadence_costs(windows, config, {"steps": 30, "eval_time_s": 0.09}, {})
    assert costs["eval"] == pytest.approx(0.03)  # 3 evaluations (the last one included)
    assert costs["log"] == pytest.approx(0.002)
    assert costs["checkpoint"] == pytest.approx(0.012)


def test_nice_ceil() -> None:
    assert [sizing.nice_ceil(x) for x in (0.3, 1, 1.2, 3, 7, 11, 49, 50, 51)] == [
        1, 1, 2, 5, 10, 20, 50, 50, 100]
