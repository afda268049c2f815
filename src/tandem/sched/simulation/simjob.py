"""One simulated job: trains at trace speed on its placement, measures itself, picks its batch."""

from __future__ import annotations

from tandem.sched.policies.cluster import node_counts
from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.goodput import GoodputModel, split_batch
from tandem.sched.policies.job import JobSpec, JobView, Placement
from tandem.sched.policies.throughput import StepSample, ThroughputModel
from tandem.sched.simulation.traces import TraceApplication


class SimJob:
    """A job's true progress (from the traces) and what it has measured of itself.

    Progress is counted in steps at the application's base batch, weighted by statistical
    efficiency, so one step at global batch B with gradient statistics (|G|^2, var)
    advances it by (var + |G|^2) / (var B0 / B + |G|^2); the job ends when its progress
    reaches the end of the application's last epoch. The job measures every configuration
    it runs (step and sync time, gradient statistics) and refits its throughput model on
    each new one, as a live job records its windows in the run store.
    """

    def __init__(self, spec: JobSpec, app: TraceApplication, restart_delay: float) -> None:
        self.spec = spec
        self.app = app
        self.restart_delay = restart_delay
        self.placement: Placement = ()
        self.counts: tuple[int, ...] = ()
        self.local_bsz = 0
        self.accum_steps = 0
        self.epoch = 0
        self.progress = 0.0
        self.service = 0.0
        self.restarts = -1  # the first start is not a restart
        self.preemptions = 0
        self.resizes = 0
        self.pending_delay = 0.0
        self.done_at: float | None = None
        self.running_since: float | None = None
        self._samples: dict[tuple[int, int, float], StepSample] = {}
        self.throughput: ThroughputModel | None = None
        self.efficiency: EfficiencyModel | None = None
        self._choice_key: tuple[object, ...] | None = None
        self._choice = (0, 0)

    @property
    def batch(self) -> int:
        """Global batch of the current configuration."""
        return len(self.placement) * self.local_bsz * (self.accum_steps + 1)

    def view(self) -> JobView:
        """What a policy may know of this job."""
        return JobView(spec=self.spec, placement=self.placement, attained_service=self.service,
                       started=self.restarts >= 0, restarts=max(self.restarts, 0),
                       restart_delay=self.restart_delay,
                       progress=self.progress / self.app.total_progress,
                       throughput=self.throughput, efficiency=self.efficiency,
                       max_measured_procs=max((k[1] for k in self._samples), default=0),
                       running_since=self.running_since if self.placement else None)

    def reallocate(self, placement: Placement, now: float = 0.0) -> None:
        """Move to `placement` (empty: preempted) at time `now`; a non-empty one costs a
        restart, after which it trains again."""
        if placement and self.placement and len(placement) != len(self.placement):
            self.resizes += 1
        self.placement = placement
        self.counts = node_counts(placement)
        if not placement:
            self.preemptions += 1
            self.local_bsz = 0
            return
        self.restarts += 1
        self.pending_delay = self.restart_delay
        self.running_since = now + self.restart_delay
        self._choose_batch()

    def advance(self, now: float, seconds: float) -> None:
        """Train for `seconds` from time `now` on the current placement."""
        if not self.placement or self.done_at is not None:
            return
        procs = len(self.placement)
        delay = min(self.pending_delay, seconds)
        self.pending_delay -= delay
        self.service += delay * procs
        now += delay
        seconds -= delay
        while seconds > 0 and self.done_at is None:
            step, sync = self.app.step_sync(self.counts, self.local_bsz)
            total = step + self.accum_steps * (step - sync)
            sqr, var = self.app.grad_stats(self.batch, self.epoch)
            self._measure(step, sync, sqr, var)
            scale = self.batch / self.app.base_batch
            denom = var / scale + sqr
            gain = (var + sqr) / denom if denom > 0 else scale
            rate = gain / total
            target = self.app.progress_at(self.epoch + 1)
            dt = min(seconds, (target - self.progress) / rate)
            self.progress = target if dt < seconds else self.progress + rate * dt
            self.service += dt * procs
            now += dt
            seconds -= dt
            if self.progress >= target:
                self.epoch += 1
                if self.epoch >= self.app.max_epochs:
                    self.done_at = now
            self._choose_batch()

    def _measure(self, step: float, sync: float, sqr: float, var: float) -> None:
        eff = EfficiencyModel.from_gradient_stats(sqr, var, self.app.base_batch)
        if eff != self.efficiency:
            self.efficiency = eff
        key = (len(self.counts), len(self.placement), float(self.local_bsz))
        if key not in self._samples:
            self._samples[key] = StepSample(*key, step_time=step, sync_time=sync)
            self.throughput = ThroughputModel.fit(list(self._samples.values()))

    def _choose_batch(self) -> None:
        """Pick micro-batch and accumulation for the current size (goodput-best if adaptive)."""
        procs = len(self.placement)
        if not procs:
            return
        limits = self.spec.limits
        if not self.spec.adapt_batch:
            self.local_bsz, self.accum_steps = split_batch(self.spec.batch_size, procs, limits)
        elif self.throughput is None or self.efficiency is None:
            first = max(self.spec.batch_size, limits.min_local * procs)
            self.local_bsz, self.accum_steps = split_batch(first, procs, limits)
        else:
            key = (self.throughput, self.efficiency, len(self.counts), procs)
            if key != self._choice_key:  # the same models give the same answer
                model = GoodputModel(self.throughput, self.efficiency, limits, adapt_batch=True)
                best = model.best(len(self.counts), procs)
                self._choice_key = key
                self._choice = (best.local_bsz, best.accum_steps)
            self.local_bsz, self.accum_steps = self._choice
