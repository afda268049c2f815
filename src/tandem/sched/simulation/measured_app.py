"""A live job's measurements as a simulator application, to replay a real schedule.

The simulator advances each job by an application's step times and gradient statistics
(`TraceApplication` for the Pollux traces). `MeasuredApplication` answers the same
questions from what a live job measured: its samples/s at each process count it ran at
(other counts from the throughput model fitted to those), a fixed global batch, and a
length in optimizer steps. It has no gradient-noise statistics, so one step is one step
of progress at any size (as for a job that does not adapt its batch).
"""

from __future__ import annotations

from collections.abc import Mapping

from tandem.sched.policies.job import BatchLimits
from tandem.sched.policies.throughput import StepSample, ThroughputModel


class MeasuredApplication:
    """Step times of one job from measured (processes -> samples/s) at its global batch."""

    max_epochs = 1  # the whole job is one "epoch" of `steps` steps

    def __init__(self, name: str, batch: int, steps: int,
                 rates: Mapping[int, float]) -> None:
        if batch < 1 or steps < 1:
            raise ValueError(f"{name}: batch {batch} and steps {steps} must be >= 1")
        if not rates or any(p < 1 or r <= 0 for p, r in rates.items()):
            raise ValueError(f"{name}: rates {dict(rates)} need >= 1 (processes, samples/s > 0)")
        self.name = name
        self.base_batch = batch
        self.steps = steps
        self.rates = dict(rates)
        self.limits = BatchLimits(min_local=1, max_local=batch, max_batch=batch)
        self.model = ThroughputModel.fit([
            StepSample(nodes=1, procs=p, local_bsz=batch / p, step_time=batch / r)
            for p, r in sorted(self.rates.items())])

    def progress_at(self, epoch: int) -> float:
        """Steps done at the end of `epoch` (0 or 1)."""
        return float(self.steps) if epoch >= 1 else 0.0

    @property
    def total_progress(self) -> float:
        """Steps to the end of the job."""
        return float(self.steps)

    def rate(self, procs: int) -> float:
        """samples/s on `procs` processes: measured, else from the fitted model."""
        if procs in self.rates:
            return self.rates[procs]
        return self.model.samples_per_s(1, procs, self.base_batch / procs)

    def step_sync(self, counts: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """(step, synchronisation) seconds on processes per node `counts`.

        The synchronisation share is what a step at N processes takes beyond 1/N of a
        step at one process (never negative).
        """
        del local_bsz  # the job's batch is fixed: micro-batch = batch / processes
        procs = sum(counts)
        step = self.base_batch / self.rate(procs)
        alone = self.base_batch / self.rate(1) / procs
        return step, max(0.0, step - alone) if procs > 1 else 0.0

    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """No noise measured: |G|^2 = 1, variance 0 (every batch equally efficient)."""
        del batch, epoch
        return 1.0, 0.0
