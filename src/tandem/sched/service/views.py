"""From stored jobs and their measurements to what a policy sees (JobView), and back.

The live service and the simulator hand the same policies the same kind of view: the
spec (sizes, priority, submission time on the schedule's clock), the placement held
now, attained service, restarts, the measured restart delay, and the throughput and
efficiency models fitted to what the job measured. Batch-size adaptation is offered to
the policy only for a job that opted in *and* has measured its gradient noise scale;
without a noise scale the job's math never changes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.goodput import GoodputModel
from tandem.sched.policies.job import BatchLimits, JobSpec, JobView
from tandem.sched.service.measured import Measured, attempt_rates, throughput_model
from tandem.sched.service.records import Attempt, JobRecord
from tandem.status import HOLDING_JOB_STATES

DEFAULT_RESTART_DELAY_S = 15.0  # before a job has measured one of its own
ADAPTIVE_MAX_FACTOR = 4  # an adaptive job's largest batch, times its own, by default


@dataclass(frozen=True)
class JobState:
    """A job with its attempts and measurements: everything a decision reads."""

    record: JobRecord
    attempts: Sequence[Attempt]
    measured: Measured
    restart_delays: Sequence[float] = ()
    """Measured seconds from a resize decision to training again, this job's."""
    default_restart_delay: float = DEFAULT_RESTART_DELAY_S
    """What a restart is assumed to cost before the job has measured one (the service
    passes the median of the other jobs' measured resizes, once there are any)."""

    @property
    def base_batch(self) -> int | None:
        """The job's own global batch, once its run recorded its config."""
        return self.measured.base_batch

    def limits(self) -> BatchLimits:
        """Batch bounds: the job's own batch, or up to max_batch when adaptive."""
        base = self.base_batch or 1
        if not self.record.adaptive_batch:
            return BatchLimits(min_local=1, max_batch=max(base, 1))
        top = self.record.max_batch or ADAPTIVE_MAX_FACTOR * base
        return BatchLimits(min_local=1, max_batch=max(top, base))

    def adapts(self) -> bool:
        """Whether the policy may choose this job's batch now."""
        return (self.record.adaptive_batch and self.base_batch is not None
                and self.measured.noise_scale is not None)

    def spec(self, epoch: float) -> JobSpec:
        """The policy's JobSpec of this job (times on the schedule's clock)."""
        r = self.record
        return JobSpec(job_id=r.job_id, submit_time=max(0.0, r.submitted - epoch),
                       min_procs=r.min_procs, max_procs=r.max_procs,
                       batch_size=self.base_batch or 1, adapt_batch=self.adapts(),
                       priority=r.priority, limits=self.limits(), application=r.name)

    def rates(self) -> dict[tuple[int, int], float]:
        """Median samples/s per measured (processes, global batch)."""
        return attempt_rates(self.measured, self.attempts, self.base_batch or 1)

    def view(self, epoch: float, now: float, cluster: Cluster) -> JobView:
        """What the policy knows of the job at wall time `now`."""
        rates = self.rates()
        base = self.base_batch or 1
        delays = list(self.restart_delays)
        held = self.record.state in HOLDING_JOB_STATES
        return JobView(
            spec=self.spec(epoch), placement=(0,) * self.record.procs if held else (),
            running_since=self.running_since(epoch, now),
            attained_service=sum(a.held(now) for a in self.attempts),
            started=bool(self.attempts), restarts=max(0, len(self.attempts) - 1),
            progress=self.measured.progress,
            restart_delay=statistics.median(delays) if delays else self.default_restart_delay,
            throughput=throughput_model(rates, cluster.slots_per_node),
            efficiency=self.measured.efficiency(base) if rates else None,
            max_measured_procs=max((p for p, _ in rates), default=0))


    def running_since(self, epoch: float, now: float) -> float | None:
        """When the current attempt started training (schedule clock): its training loop's
        'segment' event (the moment the simulator's restart delay ends), else its first
        window; `now` for a running attempt that has not trained yet; None when nothing
        runs."""
        if self.record.state not in HOLDING_JOB_STATES:
            return None
        current = [a for a in self.attempts if a.ended is None]
        if not current:
            return None
        began = self.measured.first_event("segment", current[-1].launched)
        if began is not None:
            return began["time"] - epoch
        window = self.measured.first_window(current[-1].launched)
        return (window.time if window is not None else now) - epoch


def choose_batch(state: JobState, view: JobView, procs: int, cluster: Cluster) -> int | None:
    """The global batch to launch with: None (the job's own) unless the job adapts.

    An adaptive job gets the goodput-best batch at `procs` processes, rounded down to a
    multiple of `procs` (every process takes an equal share of each batch).
    """
    if not state.adapts() or view.throughput is None or view.efficiency is None:
        return None
    model = GoodputModel(view.throughput, view.efficiency, view.spec.limits, adapt_batch=True)
    best = model.best(cluster.min_nodes(procs), procs)
    batch = max(procs, best.batch - best.batch % procs)
    base = state.base_batch
    return None if batch == base else batch
