"""Configuration smells: each fires on a job that has it and not on a placebo job without
it, with its fix and a prediction computed independently here."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from tandem.tune import smells
from tandem.tune.measure import Measured
from tandem.tune.proposals import by_predicted_gain
from tandem.tune.space import Candidate

GIB = 2.0 ** 30
NO_HALF = {"ONEDNN_MAX_CPU_ISA": "AVX2"}


def _job(**over: Any) -> Measured:
    """A well-configured 2-process CPU job on 2 cores: 1 thread each, no accumulation,
    compute 80% of a 100 ms step, 0.5 GiB resident of 8 GiB available."""
    base = Measured(world=2, cpus=2, config={"train.global_batch": 128, "precision.mode": "fp32",
                                             "data.workers": 0, "plan.bucket_mb": 25.0},
                    summary={"micro_batch": 64, "accumulation": 1}, threads=1, step_s=0.1,
                    data_s=0.002, compute_s=0.08, comm_s=0.01, grad_bytes=2e6, buckets=1,
                    rss_bytes=0.5 * GIB, available_bytes=8 * GIB)
    config = {**base.config, **over.pop("config", {})}
    return dataclasses.replace(base, config=config, **over)


def _names(m: Measured) -> list[str]:
    return [s.name for s in smells.smells(m)]


def test_the_well_configured_placebo_job_has_no_smell() -> None:
    assert _names(_job()) == []


def test_half_precision_on_a_cpu_without_half_kernels() -> None:
    job = _job(config={"precision.mode": "fp16"})
    smell = smells.half_on_cpu(job, NO_HALF)
    assert smell is not None and smell.fix == {"precision.mode": "fp32"}
    c = 0.8
    assert smell.predicted == pytest.approx(1 / (1 - c + c / smells.HALF_CPU_SLOWDOWN))
    assert smells.half_on_cpu(_job(), NO_HALF) is None  # placebo: fp32
    on_gpu = dataclasses.replace(job, cuda_peak=1e9, cuda_total=8e10)
    assert smells.half_on_cpu(on_gpu, NO_HALF) is None  # a GPU has the kernels


def test_micro_batch_far_below_memory() -> None:
    job = _job(summary={"micro_batch": 2, "accumulation": 32}, available_bytes=64 * GIB)
    smell = smells.small_micro_batch(job)
    assert smell is not None and smell.fix == {"train.micro_batch": 64}
    assert smell.predicted == pytest.approx(math.sqrt(32))
    assert smells.small_micro_batch(_job()) is None
    # placebo: memory does not allow it (each rank near what the host has)
    tight = dataclasses.replace(job, rss_bytes=3.9 * GIB, available_bytes=1 * GIB)
    assert smells.small_micro_batch(tight) is None


def test_activation_checkpointing_with_memory_to_spare() -> None:
    job = _job(config={"plan.activation_checkpointing": True})
    smell = smells.checkpointing_to_spare(job)
    assert smell is not None and smell.fix == {"plan.activation_checkpointing": False}
    assert smell.predicted == pytest.approx(1 / (1 - 0.8 * smells.RECOMPUTE_SHARE))
    full = dataclasses.replace(job, rss_bytes=6 * GIB, available_bytes=2 * GIB)
    assert smells.checkpointing_to_spare(full) is None  # placebo: memory is short
    assert smells.checkpointing_to_spare(_job()) is None


def test_loader_workers_for_data_that_costs_nothing() -> None:
    job = _job(config={"data.workers": 2})
    smell = smells.workers_for_cheap_data(job)
    assert smell is not None and smell.fix == {"data.workers": 0}
    assert smell.predicted == pytest.approx(min(smells.MAX_PRIOR, 2 * (1 + 2) / 2))
    # placebo: the workers hide a real loading cost (data wait 40% of the step)
    assert smells.workers_for_cheap_data(dataclasses.replace(job, data_s=0.04)) is None
    # placebo: cores enough for the workers too
    assert smells.workers_for_cheap_data(dataclasses.replace(job, cpus=8)) is None


def test_more_threads_than_cores() -> None:
    smell = smells.threads_over_cores(_job(threads=4))
    assert smell is not None and smell.fix == {"plan.threads": 1}
    assert smell.predicted == pytest.approx(smells.MAX_PRIOR)
    assert smells.threads_over_cores(_job(threads=1)) is None


def test_buckets_or_a_hook_that_do_not_fit_the_gradient() -> None:
    tiny = _job(config={"plan.bucket_mb": 0.02}, buckets=190, grad_bytes=12.6e6,
                comm_s=0.05)
    smell = smells.bucket_or_hook_misfit(tiny)
    assert smell is not None
    assert smell.fix == {"plan.bucket_mb": math.ceil(12.6e6 / 4 / 2 ** 20 * 10) / 10}
    assert smell.predicted == pytest.approx(0.1 / (0.1 - 0.05))
    hook = _job(config={"plan.comm_hook": "powersgd"}, grad_bytes=1e6)
    assert smells.bucket_or_hook_misfit(hook).fix == {"plan.comm_hook": "none"}
    # placebos: a hook on a large gradient, buckets that fit, one process
    big = _job(config={"plan.comm_hook": "powersgd"}, grad_bytes=400e6)
    assert smells.bucket_or_hook_misfit(big) is None
    assert smells.bucket_or_hook_misfit(_job(buckets=3, grad_bytes=60e6)) is None
    assert smells.bucket_or_hook_misfit(dataclasses.replace(tiny, world=1)) is None


def test_a_smell_is_a_finding_and_a_candidate() -> None:
    smell = smells.threads_over_cores(_job(threads=4))
    assert smell is not None
    finding, cand = smell.finding(), smell.candidate()
    assert finding.kind == smells.KIND and finding.predicted_speedup == smell.predicted
    assert cand.changes == {"plan.threads": 1} and cand.predicted == smell.predicted


def test_candidates_are_tried_largest_predicted_gain_first() -> None:
    cands = [Candidate({"a": 1}, "x", "", predicted=1.2), Candidate({"b": 1}, "x", ""),
             Candidate({"c": 1}, "x", "", predicted=5.0),
             Candidate({"d": 1}, "x", "", predicted=1.5)]
    assert [next(iter(c.changes)) for c in by_predicted_gain(cands)] == ["c", "d", "a", "b"]


def test_a_probe_without_a_summary_still_shows_its_accumulation() -> None:
    """A probe stopped early writes no summary: the batch split comes from its settings."""
    probe = _job(summary={}, config={"train.micro_batch": 2}, available_bytes=64 * GIB)
    assert (probe.micro, probe.accum) == (2, 32)
    smell = smells.small_micro_batch(probe)
    assert smell is not None and smell.fix == {"train.micro_batch": 64}
    assert smells.small_micro_batch(_job(summary={})) is None  # micro-batch 0: 64, 1 pass


def test_workers_for_samples_timed_as_already_in_memory() -> None:
    # The workers' own contention makes a data wait of 27% of the step: without the
    # samples' cost the rule reads that as input-bound; with it, the workers are the smell.
    job = _job(config={"data.workers": 2}, data_s=0.027, sample_s=1e-6)
    smell = smells.workers_for_cheap_data(job)
    assert smell is not None and smell.fix == {"data.workers": 0}
    assert smell.predicted == pytest.approx(smells.MAX_PRIOR)  # 2 x (1 + 2) on 2 cores
    # cores to spare: the gain is the data wait given back, less the reading itself
    roomy = dataclasses.replace(job, cpus=16)
    smell = smells.workers_for_cheap_data(roomy)
    assert smell is not None
    assert smell.predicted == pytest.approx(0.1 / (0.1 - 0.027 + 64 * 1e-6))
    # without the samples' cost, the same data wait is read as a loading cost
    assert smells.workers_for_cheap_data(dataclasses.replace(job, sample_s=None)) is None


def test_workers_on_lazy_data_are_no_smell() -> None:
    # placebo: a sample takes 2 ms to read: a step's 64 would take 128% of the step
    lazy = _job(config={"data.workers": 2}, data_s=0.002, sample_s=2e-3)
    assert smells.workers_for_cheap_data(lazy) is None
    # placebo: data.in_memory gathers batches without the loader: workers do nothing
    gathered = _job(config={"data.workers": 2, "data.in_memory": True}, sample_s=1e-6)
    assert smells.workers_for_cheap_data(gathered) is None
