"""Throughput at other process counts, predicted from one run's measured phases.

A data-parallel step (DDP or one process) on rank r takes, in wall-clock seconds,

    step = work / share + sleep + wait

- **work**: the core-seconds the rank computes per step (device-seconds on CUDA): forward
  and backward, data, the optimizer, the loop's own overhead ("other"), and on a CPU host
  the collectives' bytes (`scaling_comm`). On CPU the run measures it directly: rank 0's
  process CPU x the step time. A phase's wall time cannot tell it once ranks share cores,
  because a phase then also holds the time the rank waited for a core (4 ranks on 2 idle
  cores: much of the exposed all-reduce is other ranks computing). Where every rank
  has a core of its own (foreign threads aside: the share reads those phases), the phases
  tell it without the noise of the CPU sample: all but the exposed collective and the
  wait, plus the bytes' work inside the collective. The two readings are blended by how
  far the ranks alone oversubscribe the cores.
- **share** (`cpu_share`): one thread per process, C cores and `background` foreign
  CPU-bound threads: every runnable thread gets min(1, C / (N + background)) of a core
  (the kernel's fair share). Four processes on two idle cores get half a core each;
  beside three busy foreign threads one process gets 0.5 and four get 0.29 each. A rank
  that slept in the step's collective runs its first `WAKE_CREDIT_S` ahead of the foreign
  threads (they did not sleep; the other ranks did), at min(1, C / N). On CUDA the
  devices are shared instead: min(1, G / N).
- **sleep**: what the collectives leave no core to do, the ring's hops; the ranks meet in
  them, so with shared cores those cores idle. The run's sleep is what its step leaves
  after its work at its share.
- **wait** for the last rank (`scaling_comm.wait_units`): with a core each the step waits
  sigma x E[max of N]; sharing cores, a rank that arrived sleeps and gives its share to
  the threads still working, so the wait costs less than the ranks measure waiting (the
  rest is in the phases: the mean rank ran that much faster than the fair share).

The work is rebuilt at N from the run's: forward, backward and data scale with the
samples a rank handles per step (the global batch is the contract: B / N per rank, as k
micro-batches of m); the rest is per step (DDP replicates the optimizer). Their split at
the run's size reads the compute phase's wall at the share a computing rank had: ranks
that reached the collective first sleep there (their mean sync wait) and leave their
share to the others. Per-micro-batch overhead is not separated from per-sample cost: the
interval widens with |log2(m / m0)|. Two per-step costs have laws of their own: the
bytes' work (`scaling_comm`; no more than the run's exposed collective held), and the
cold start of a rank whose core is shared (`COLD_START_S` core-seconds per step x the
saturation: its caches were emptied by the ranks that ran while it slept). The run's
own are taken out of its per-step work and the ones at N put back: they are paid right
after the collective, where the optimizer runs (at 4 ranks on 2 cores the compute
phase at the fair share holds the one-process per-sample work and no more). Where a
small step's per-step work has no room for the cold start's prior, it is scaled to
what the step had.

What is not modelled: FSDP, local SGD / DiLoCo, tensor parallelism, batch ramps, data
loader workers' own CPU demand, memory limits, several nodes, an optimizer that divides
its step over the ranks (the run store does not record one: Muon's shared
orthogonalisations are taken as replicated work), and DDP's own per-step work (a
one-process run cannot show it; the sleep it adds is `scaling_comm`'s fixed
`step_wake_s`). A prediction holds for the background the run saw; the
interval spans the background's quartiles over the run's windows, its drift by +-20%
since, and each term's stated uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from tandem.analyze.scaling.comm import (
    CommModel,
    WaitModel,
    comm_model,
    cpu_share,
    fit_sleep,
    saturation,
    wait_model,
    wait_units,
)

HOOK_BYTES = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # buffer bytes per gradient byte
SATURATED = 0.95  # host CPU utilisation above which every core is taken
# Core-seconds a rank's step costs beyond its work when it shares its core (its caches
# start cold after others ran): the fixed part of MNIST-1D's CNN's step timed by thread
# CPU time at three micro-batch sizes beside other jobs; on an idle core there is only
# the per-sample cost (docs/benchmarks.md: the scaling model).
COLD_START_S = 6e-3
# The same with DDP's all-reduce through shared memory (no gloo threads on the cores):
# what 4-process MNIST-1D runs on 2 cores used a rank per step beyond the one-process
# work of their samples and optimizer step (process CPU time, three runs,
# docs/benchmarks.md: the scaling model).
SHM_COLD_START_S = 3.3e-3
# Core-seconds a rank runs ahead of foreign threads when it wakes from the step's
# collective, before it is back to its fair share (the scheduler favours a task that
# slept): a 2-rank DDP step's optimizer, right after the all-reduce, ran well above its
# fair share of a core beside other jobs (docs/benchmarks.md: the scaling model).
WAKE_CREDIT_S = 5e-3
# Relative uncertainty of each term (one standard deviation, as judged from the model's
# assumptions): compute per sample grows this much per halving/doubling of the
# micro-batch; communication fitted from the run vs from priors; the sync wait.
U_WORK, U_PER_OCTAVE, U_STEP = 0.04, 0.06, 0.10
U_COMM_FIT, U_COMM_PRIOR, U_WAIT = 0.30, 0.60, 0.50
# How far the foreign load may have moved between the run and the prediction's use: as
# far as interleaved runs minutes apart on a shared host saw their backgrounds move
# (docs/benchmarks.md: the scaling model).
BACKGROUND_DRIFT = 0.2


@dataclass(frozen=True, kw_only=True)
class RunFigures:
    """What one run measured (steady-state medians per optimizer step) and how it ran."""

    world_size: int
    global_batch: int
    micro_batch: int
    """Samples per forward/backward in the run."""
    micro_batch_setting: int = 0
    """train.micro_batch: 0 derives it at every size (global / world, no accumulation)."""
    device: str = "cpu"
    cores: int
    devices: int = 0
    """Accelerators on the machine (CUDA); 0 on CPU."""
    step_s: float
    compute_s: float
    """Forward + backward minus backward's wait for communication."""
    backward_s: float = 0.0
    data_s: float = 0.0
    """Data wait and host-to-device copy."""
    optim_s: float = 0.0
    comm_exposed_s: float = 0.0
    sync_wait_s: float = 0.0
    samples_per_s: float = 0.0
    grad_bytes: float = 0.0
    comm_hook: str = "none"
    shared_memory: bool = False
    """DDP's all-reduce goes (or at more processes would go) through the host's shared
    memory (`plan.host_allreduce`), not gloo's sockets."""
    bucket_bytes: float = 25 * 2**20
    bytes_per_step: float | None = None
    """Bytes each rank sends per step (ring-counted), as measured (None at N0 = 1)."""
    buckets_per_step: float | None = None
    latency_s: float | None = None
    allreduce_bytes_per_s: float | None = None
    host_cpu: Sequence[float] = field(default_factory=tuple)
    """Per steady window: fraction of all cores busy on the host."""
    process_cpu: Sequence[float] = field(default_factory=tuple)
    """Per steady window: rank 0's process CPU, in cores."""
    run_id: str = ""

    @property
    def other_s(self) -> float:
        """The step's time outside every measured phase (the loop's own overhead)."""
        parts = (self.compute_s + self.data_s + self.optim_s + self.comm_exposed_s
                 + self.sync_wait_s)
        return max(0.0, self.step_s - parts)


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """The predicted steady state of the job at one process count."""

    world_size: int
    samples_per_s: float
    low: float
    high: float
    """An interval of samples/s (see the module docstring for what it covers)."""
    step_s: float
    micro_batch: int
    accum: int
    cpu_share: float
    """The share of a core (of a device on CUDA) each rank's compute gets."""
    compute_s: float
    data_s: float
    optim_s: float
    other_s: float
    wire_s: float
    """The collectives per step: their bytes' work at the rank's share, and the sleep in
    their hops."""
    wait_s: float
    """What the wait for the slowest rank adds to the step."""

    @property
    def breakdown(self) -> dict[str, float]:
        """Seconds per step by term."""
        return {"compute": self.compute_s, "data": self.data_s, "optim": self.optim_s,
                "other": self.other_s, "wire": self.wire_s, "wait": self.wait_s}


def batch_split(fig: RunFigures, n: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) of the run's global batch on n processes."""
    batch = fig.global_batch
    if n < 1 or batch % n:
        raise ValueError(f"world size {n}: train.global_batch {batch} is not divisible by "
                         "it; choose a divisor of the global batch")
    per_rank = batch // n
    micro = fig.micro_batch_setting or per_rank
    if micro > per_rank or per_rank % micro:
        raise ValueError(f"world size {n}: train.micro_batch {micro} does not divide the "
                         f"per-rank batch {per_rank}")
    return micro, per_rank // micro


def _busy_fraction(fig: RunFigures) -> float:
    """The fraction of a step rank 0 is runnable: all but its wait for slower ranks. (On
    a saturated host the exposed all-reduce is mostly spent runnable, waiting for a
    core; a rank waiting for a slower peer sleeps.)"""
    if fig.step_s <= 0:
        return 1.0
    return min(1.0, max(0.2, 1.0 - fig.sync_wait_s / fig.step_s))


def background_threads(fig: RunFigures) -> tuple[float, float, float]:
    """(median, lower quartile, upper quartile) of the foreign CPU-bound threads beside
    the run, one estimate per window.

    A host with spare CPU ran everything runnable: the foreign load is what the host
    used beyond the run's processes. A saturated host shared its cores fairly: each
    foreign thread got the share a rank got while runnable, so the foreign count is
    what the host used beyond the run's processes over that share (C / share - N0 on a
    host busy to the last core; none where the run's own ranks used all the host did).
    On CUDA a rank is not CPU-bound, so only the first rule applies.
    """
    if not fig.host_cpu or len(fig.host_cpu) != len(fig.process_cpu):
        return 0.0, 0.0, 0.0
    runnable = _busy_fraction(fig)
    estimates = []
    for host, proc in zip(fig.host_cpu, fig.process_cpu, strict=True):
        if host < SATURATED or fig.device != "cpu":
            estimates.append(max(0.0, fig.cores * host - fig.world_size * proc))
            continue
        share = min(1.0, max(proc, 1e-3) / runnable)
        estimates.append(max(0.0, (fig.cores * host - fig.world_size * proc) / share))
    estimates.sort()
    q = len(estimates) - 1
    return median(estimates), estimates[q // 4], estimates[-(q // 4) - 1]


def _share(fig: RunFigures, n: int, background: float) -> float:
    """The share of a compute unit each of n ranks gets (cores on CPU, devices on CUDA)."""
    if fig.device == "cuda":
        return min(1.0, max(fig.devices, 1) / n)
    return cpu_share(n, fig.cores, background)


def _credit(fig: RunFigures, n: int) -> float:
    """Core-seconds a rank runs ahead of foreign threads after it slept in the step's
    collective."""
    return WAKE_CREDIT_S if fig.device == "cpu" and n > 1 else 0.0


def _wall(fig: RunFigures, work: float, n: int, background: float) -> float:
    """Wall seconds of a rank's `work` core-seconds at n ranks beside `background`
    threads: the first `_credit` at the share the ranks leave each other, the rest at
    the fair share."""
    share, credit = _share(fig, n, background), _credit(fig, n)
    fast = min(work, credit)
    return fast / _share(fig, n, 0.0) + (work - fast) / share


def _work_in(fig: RunFigures, wall: float, n: int, background: float) -> float:
    """Core-seconds a rank works in `wall` runnable seconds: the inverse of `_wall`."""
    share, credit, quick = _share(fig, n, background), _credit(fig, n), _share(fig, n, 0.0)
    if wall * quick <= credit:
        return wall * quick
    return credit + (wall - credit / quick) * share


def _computing_share(fig: RunFigures, source: float) -> float:
    """The share of a core a rank had while it computed: the ranks that reached the
    collective first sleep there (their mean sync wait) and leave theirs to the rest."""
    n0 = fig.world_size
    if fig.device != "cpu" or fig.compute_s <= 0:
        return _share(fig, n0, source)
    asleep = (n0 - 1) * min(1.0, fig.sync_wait_s / fig.compute_s)
    return cpu_share(1, fig.cores, n0 - 1 - asleep + source)


def _cold(fig: RunFigures, n: int, background: float) -> float:
    """A step's cold start in core-seconds at n ranks (0 while every rank has a core)."""
    if fig.device != "cpu":
        return 0.0
    cold = SHM_COLD_START_S if fig.shared_memory else COLD_START_S
    return cold * saturation(n, fig.cores, background)


def _buffer(fig: RunFigures) -> tuple[float, float]:
    """(buffer bytes, buckets) of a step's all-reduce."""
    n0 = fig.world_size
    if n0 > 1 and fig.bytes_per_step:
        buffer = fig.bytes_per_step / (2 * (n0 - 1) / n0)
    else:
        if fig.comm_hook not in HOOK_BYTES:
            raise ValueError(f"plan.comm_hook {fig.comm_hook!r}: a one-process run cannot "
                             f"tell its bytes; modelled: {', '.join(HOOK_BYTES)}")
        buffer = fig.grad_bytes * HOOK_BYTES[fig.comm_hook]
    return buffer, fig.buckets_per_step or max(1.0, math.ceil(buffer / fig.bucket_bytes))


def _units(fig: RunFigures, background: float) -> tuple[int, float]:
    """(compute units, foreign threads) the ranks' arrival spread is spread over."""
    if fig.device == "cuda":
        return max(fig.devices, 1), 0.0
    return fig.cores, background


@dataclass(frozen=True)
class _Accounts:
    """A rank's step at the run's size in core-seconds (device-seconds on CUDA), less the
    modelled overheads, and the run's collectives and wait."""

    compute: float
    data: float
    optim: float
    other: float
    seen: float
    """Fraction of the cold start's prior the run's per-step work had room for: 1 unless
    the prior charges more than a small step spent."""
    comm: CommModel
    wait: WaitModel


def _measured_work(fig: RunFigures, source: float, bytes0: float, wait0: float) -> float:
    """Core-seconds (device-seconds) a rank worked per step in the run (see the module
    docstring); `wait0`: what the wait for the last rank cost the step."""
    n0, step = fig.world_size, fig.step_s
    # The phases are the mean rank's: the ranks that arrived early slept their mean wait
    # and the late ones ran that much faster than the fair share, less what it cost.
    working = max(0.0, step - fig.comm_exposed_s - wait0)
    if fig.device != "cpu":
        return _share(fig, n0, source) * working
    phases = _work_in(fig, working, n0, source) + bytes0
    measured = median(fig.process_cpu) * step if fig.process_cpu else phases
    # Beside foreign threads the share reads the phases; where the ranks themselves
    # outnumber the cores, a phase also holds the other ranks' work.
    oversubscribed = saturation(n0, fig.cores, 0.0)
    work = (1.0 - oversubscribed) * phases + oversubscribed * measured
    return min(work, _work_in(fig, step, n0, source))


def _accounts(fig: RunFigures, source: float) -> _Accounts:
    """The run's step split by how each part scales, beside `source` foreign threads."""
    n0 = fig.world_size
    buffer, buckets = _buffer(fig)
    host = cpu_share(n0, fig.cores, source)
    comm = comm_model(world=n0, device=fig.device, buffer_bytes=buffer, buckets=buckets,
                      latency_s=fig.latency_s, allreduce_bytes_per_s=fig.allreduce_bytes_per_s,
                      backward_s=fig.backward_s, cores=fig.cores, background=source,
                      share=host, shared_memory=fig.shared_memory)
    if n0 > 1 and comm.work(n0) > fig.comm_exposed_s * host:
        # The bytes' work cannot have taken longer than the exposed collective it is in.
        comm = comm.faster(fig.comm_exposed_s * host / comm.work(n0))
    units, spread_over = _units(fig, source)
    cost_units, wait_units_ = wait_units(n0, units, spread_over)
    cost = fig.sync_wait_s * cost_units / wait_units_ if wait_units_ > 0 else 0.0
    work = _measured_work(fig, source, comm.work(n0), cost)
    # Per sample: forward, backward and data, at the share a computing rank had.
    walls = fig.compute_s + fig.data_s
    per_sample = min(work, walls * _computing_share(fig, source))
    # Per step: what is left, less the bytes' work (no more than there is) and the cold
    # start as far as it had room for it (paid right after the collective, where the
    # optimizer runs).
    per_step = work - per_sample
    if comm.work(n0) > per_step:
        comm = comm.faster(per_step / comm.work(n0))
    per_step -= comm.work(n0)
    cold = _cold(fig, n0, source)
    seen = min(1.0, per_step / cold) if cold > 0 else 1.0
    replicated = per_step - seen * cold
    compute = per_sample * fig.compute_s / walls if walls > 0 else 0.0
    loop = fig.optim_s + fig.other_s
    optim = replicated * fig.optim_s / loop if loop > 0 else 0.0
    # What the step leaves after the work at its share: asleep in the collectives or
    # waiting for the last rank.
    asleep = max(0.0, fig.step_s - _wall(fig, work, n0, source))
    before = per_sample + seen * cold + replicated - optim  # before the collective
    wait = wait_model(world=n0, sync_wait_s=fig.sync_wait_s, work_s=before, cores=units,
                      background=spread_over)
    if cost > asleep:  # the wait cannot cost more than the step left
        wait = WaitModel(per_work=wait.per_work * asleep / cost,
                         scheduled=wait.scheduled * asleep / cost)
        cost = asleep
    if n0 > 1:
        comm = fit_sleep(comm, n0, asleep - cost, fig.cores, source)
    return _Accounts(compute=compute, data=per_sample - compute, optim=optim,
                     other=replicated - optim, seen=seen, comm=comm, wait=wait)


def _terms(fig: RunFigures, n: int, source: float, target: float) -> dict[str, float]:
    """Seconds per step of each term at n ranks: the run measured beside `source` foreign
    threads, the prediction is for `target` of them."""
    run = _accounts(fig, source)
    _, accum = batch_split(fig, n)
    samples = fig.world_size / n  # each rank's samples per step, relative to the run's
    compute = run.compute * samples + run.seen * _cold(fig, n, target)
    data = run.data * samples
    wire = run.comm.work(n)
    work = compute + data + run.optim + run.other + wire
    wall = _wall(fig, work, n, target)
    # The bytes' work comes last, in the collective; the rest shares the wall before it.
    rest = work - wire
    rest_wall = _wall(fig, rest, n, target)
    wire_wall = wall - rest_wall
    scale = rest_wall / rest if rest > 0 else 0.0  # wall seconds per core-second
    units, spread_over = _units(fig, target)
    wait = run.wait.cost(n, compute + data + run.other, units, spread_over)
    return {"optim": run.optim * scale, "other": run.other * scale, "data": data * scale,
            "compute": compute * scale,
            "wire": wire_wall + run.comm.sleep(n, target, fig.cores), "wait": wait,
            "share": _share(fig, n, target), "accum": float(accum),
            "fitted": float(run.comm.fitted)}


def _spread(fig: RunFigures, n: int, terms: dict[str, float]) -> float:
    """One standard deviation of the step time from the terms' own uncertainties."""
    micro, _ = batch_split(fig, n)
    octaves = abs(math.log2(micro / fig.micro_batch))
    u_comm = U_COMM_FIT if terms["fitted"] else U_COMM_PRIOR
    parts = [(U_WORK + U_PER_OCTAVE * octaves) * (terms["compute"] + terms["data"]),
             U_STEP * (terms["optim"] + terms["other"]),
             u_comm * terms["wire"], U_WAIT * terms["wait"]]
    return math.sqrt(sum(p * p for p in parts))


def step_seconds(terms: dict[str, float]) -> float:
    """The step time from its terms."""
    return sum(terms[k] for k in ("compute", "data", "optim", "other", "wire", "wait"))


def predict_one(fig: RunFigures, n: int, background: float | None = None) -> Prediction:
    """The job's steady state at n processes beside `background` foreign threads (None:
    as many as beside the run)."""
    if n < 1:
        raise ValueError(f"world size {n}: must be >= 1")
    if background is not None and background < 0:
        raise ValueError(f"background {background}: must be >= 0 (foreign threads)")
    middle, lo, hi = background_threads(fig)
    target = middle if background is None else background
    terms = _terms(fig, n, middle, target)
    step = step_seconds(terms)
    if step <= 0:
        raise ValueError(f"run {fig.run_id!r}: no measured step time to scale "
                         f"(time/step {fig.step_s:g} s)")
    # The run's background over its windows; and, unless told the background at
    # prediction time, its drift by then.
    cases = [(lo, lo if background is None else background),
             (hi, hi if background is None else background)]
    if background is None:
        cases += [(middle, middle * (1 - BACKGROUND_DRIFT)),
                  (middle, middle * (1 + BACKGROUND_DRIFT))]
    others = [step_seconds(_terms(fig, n, source, later)) for source, later in cases]
    sigma = _spread(fig, n, terms)
    slow = step + math.hypot(sigma, max(0.0, max(others) - step))
    fast = max(step * 0.1, step - math.hypot(sigma, max(0.0, step - min(others))))
    micro, accum = batch_split(fig, n)
    batch = fig.global_batch
    return Prediction(world_size=n, samples_per_s=batch / step, low=batch / slow,
                      high=batch / fast, step_s=step, micro_batch=micro, accum=accum,
                      cpu_share=terms["share"], compute_s=terms["compute"],
                      data_s=terms["data"], optim_s=terms["optim"],
                      other_s=terms["other"], wire_s=terms["wire"], wait_s=terms["wait"])


def predict(fig: RunFigures, world_sizes: Iterable[int],
            background: float | None = None) -> dict[int, Prediction]:
    """Predicted throughput and its breakdown at each of `world_sizes`, from one run.

    `background`: foreign CPU-bound threads on the machine at prediction time (0: a
    dedicated machine); None assumes what the run saw (`background_threads`). The run's
    own background is always taken from its measurements.
    """
    return {n: predict_one(fig, n, background) for n in sorted(set(world_sizes))}


if __name__ == "__main__":
    from tandem.analyze.scaling.cli import main

    raise SystemExit(main())
