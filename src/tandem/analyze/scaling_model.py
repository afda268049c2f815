"""Throughput at other process counts, predicted from one run's measured phases.

A data-parallel step (DDP or one process) on rank r is, in wall-clock seconds,

    step = compute + data + optim + other + exposed communication + sync wait

and each term is rebuilt at N processes from what the one run measured at N0:

- **Work** (compute, data, optim, the loop's own overhead "other") is turned into
  seconds on a dedicated core by the CPU share the run had, then divided by the share
  at N. compute and data scale with the samples each rank handles per step (the global
  batch is the contract: B / N per rank, as k micro-batches of m); optim and other are
  per step (DDP replicates the optimizer). Per-micro-batch overhead is not separated
  from per-sample cost: the interval widens with |log2(m / m0)|. Two effects of sharing a
  core are added: a rank whose core is shared pays a cold start each step
  (`COLD_START_S` core-seconds: its caches were emptied by others), and a rank that
  slept in the step's collective runs its first `WAKE_CREDIT_S` at full speed after it
  (the optimizer, the loop, the data) before it is back to its fair share.
- **CPU share** (`cpu_share`): one thread per process, C cores, and `background`
  foreign CPU-bound threads: every runnable thread gets min(1, C / (N + background))
  of a core while the N ranks compute together (the kernel's fair share). The
  background is estimated from the run itself: the host's CPU utilisation and rank 0's
  process CPU in each window (`background_threads`). Four processes on two idle
  cores each get half a core; beside three busy foreign threads one process gets 0.5
  of a core and four get 0.29 each. On CUDA the devices are shared instead: min(1, G / N).
- **Exposed communication** and **sync wait** (`scaling_comm`): the ring all-reduce's
  2(N-1) hops and 2(N-1)/N bytes per rank, the bucket copies and the bytes' CPU work at
  the rank's share of a core, the wake to a busy core; the wait for the last rank as
  sigma x E[max of N normals]. A multi-process run fits them to what it measured (its
  calibrated link, its exposed time, its wait); a one-process run uses priors.

What is not modelled: FSDP, local SGD / DiLoCo, tensor parallelism, batch ramps, data
loader workers' own CPU demand, memory limits, several nodes. A prediction holds for the
background the run saw; the interval spans the background's quartiles over the run's
windows, its drift by +-20% since, and each term's stated uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

from tandem.analyze.scaling_comm import (
    CommModel,
    WaitModel,
    comm_model,
    cpu_share,
    saturation,
    wait_model,
)

HOOK_BYTES = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # buffer bytes per gradient byte
SATURATED = 0.95  # host CPU utilisation above which every core is taken
# Core-seconds a rank's forward and backward cost per step beyond their per-sample work
# when it shares its core (its caches start cold after others ran): MNIST-1D's CNN,
# timed by thread CPU time at 128, 64 and 32 samples per rank beside other jobs, cost
# 7 ms + 0.29 ms per sample; on an idle core the per-sample cost alone.
COLD_START_S = 6e-3
# Core-seconds a rank runs at full speed when it wakes from the step's collective, before
# it is back to its fair share (the scheduler favours a task that slept): on the same
# machine a 2-rank DDP step's optimizer, right after the all-reduce, ran at ~0.75 of a
# core beside other jobs while the fair share was ~0.3.
WAKE_CREDIT_S = 5e-3
# Relative uncertainty of each term (one standard deviation, as judged from the model's
# assumptions): compute per sample grows this much per halving/doubling of the
# micro-batch; communication fitted from the run vs from priors; the sync wait.
U_WORK, U_PER_OCTAVE, U_STEP = 0.04, 0.06, 0.10
U_COMM_FIT, U_COMM_PRIOR, U_WAIT = 0.30, 0.60, 0.50
# How far the foreign load may have moved between the run and the prediction's use:
# interleaved runs minutes apart on the shared 2-core machine saw backgrounds +-20% apart.
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
    """Exposed communication per step."""
    wait_s: float
    """Mean wait for the slowest rank per step."""

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
    used beyond the run's processes. A saturated host shared its cores fairly: the
    share a rank got while runnable, C / (N0 + foreign), gives the foreign count.
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
        estimates.append(max(0.0, fig.cores / share - fig.world_size))
    estimates.sort()
    q = len(estimates) - 1
    return median(estimates), estimates[q // 4], estimates[-(q // 4) - 1]


def _share(fig: RunFigures, n: int, background: float) -> float:
    """The share of a compute unit each of n ranks gets (cores on CPU, devices on CUDA)."""
    if fig.device == "cuda":
        return min(1.0, max(fig.devices, 1) / n)
    return cpu_share(n, fig.cores, background)


def _models(fig: RunFigures, source: float) -> tuple[CommModel, WaitModel]:
    """The run's communication and wait, fitted beside `source` foreign threads."""
    n0 = fig.world_size
    if n0 > 1 and fig.bytes_per_step:
        buffer = fig.bytes_per_step / (2 * (n0 - 1) / n0)
    else:
        if fig.comm_hook not in HOOK_BYTES:
            raise ValueError(f"plan.comm_hook {fig.comm_hook!r}: a one-process run cannot "
                             f"tell its bytes; modelled: {', '.join(HOOK_BYTES)}")
        buffer = fig.grad_bytes * HOOK_BYTES[fig.comm_hook]
    buckets = fig.buckets_per_step or max(1.0, math.ceil(buffer / fig.bucket_bytes))
    host = cpu_share(n0, fig.cores, source)
    comm = comm_model(world=n0, device=fig.device, buffer_bytes=buffer, buckets=buckets,
                      latency_s=fig.latency_s, allreduce_bytes_per_s=fig.allreduce_bytes_per_s,
                      exposed_s=fig.comm_exposed_s, backward_s=fig.backward_s,
                      cores=fig.cores, background=source,
                      share=host if fig.device == "cpu" else 1.0)
    wait = wait_model(world=n0, sync_wait_s=fig.sync_wait_s,
                      work_s=fig.compute_s + fig.data_s + fig.other_s, cores=fig.cores,
                      background=source)
    return comm, wait


def _cold(fig: RunFigures, n: int, background: float) -> float:
    """A step's cold start in core-seconds at n ranks (0 while every rank has a core)."""
    if fig.device != "cpu":
        return 0.0
    return COLD_START_S * saturation(n, fig.cores, background)


def _compute(fig: RunFigures, n: int, measured: float, cold0: float, cold: float) -> float:
    """Core-seconds of a rank's forward and backward at n ranks, from the run's
    `measured` core-seconds: per sample, plus the cold start (`cold0` in the run,
    `cold` at n ranks)."""
    warm = max(0.1 * measured, measured - cold0)
    per_sample = warm / (fig.global_batch / fig.world_size)
    # The cold start the run can have paid is what its measured time leaves after the
    # warm part (less than `cold0` when the whole step is shorter): scaled by the cold
    # start at n ranks, so that at the run's own size the run's own time comes back.
    seen = measured - warm
    return per_sample * fig.global_batch / n + (seen * cold / cold0 if cold0 > 0 else cold)


def _credit(fig: RunFigures, n: int) -> float:
    """Core-seconds a rank runs at full speed after it slept in the step's collective."""
    return WAKE_CREDIT_S if fig.device == "cpu" and n > 1 else 0.0


def _core_seconds(walls: Sequence[tuple[float, float]], credit: float) -> list[float]:
    """Core-seconds of phases (wall seconds, share), in the order they run after the
    collective: the first `credit` core-seconds ran at full speed."""
    out = []
    for wall, share in walls:
        fast = min(wall, credit)
        credit -= fast
        out.append(fast + (wall - fast) * share)
    return out


def _walls(work: Sequence[tuple[float, float]], credit: float) -> list[float]:
    """Wall seconds of phases (core-seconds, share): the inverse of `_core_seconds`."""
    out = []
    for seconds, share in work:
        fast = min(seconds, credit)
        credit -= fast
        out.append(fast + (seconds - fast) / share)
    return out


def _terms(fig: RunFigures, n: int, source: float, target: float) -> dict[str, float]:
    """Seconds per step of each term at n ranks: the run measured beside `source` foreign
    threads, the prediction is for `target` of them."""
    n0 = fig.world_size
    _, accum = batch_split(fig, n)
    work0, work = _share(fig, n0, source), _share(fig, n, target)
    host0, host = cpu_share(n0, fig.cores, source), cpu_share(n, fig.cores, target)
    # The phases in the order they run after the collective (optimizer first).
    optim, other, data0, compute0 = _core_seconds(
        [(fig.optim_s, work0), (fig.other_s, host0), (fig.data_s, host0),
         (fig.compute_s, work0)], _credit(fig, n0))
    compute = _compute(fig, n, compute0, _cold(fig, n0, source), _cold(fig, n, target))
    data = data0 * n0 / n  # each rank's share of the global batch, relative to the run's
    walls = _walls([(optim, work), (other, host), (data, host), (compute, work)],
                   _credit(fig, n))
    comm, waits = _models(fig, source)
    wire = comm.exposed(n, host if fig.device == "cpu" else 1.0, target, fig.cores)
    wait = waits.wait(n, walls[1] + walls[2] + walls[3], fig.cores, target)
    return {"optim": walls[0], "other": walls[1], "data": walls[2], "compute": walls[3],
            "wire": wire, "wait": wait, "share": work, "accum": float(accum),
            "fitted": float(comm.fitted)}


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


def throughput_points(predictions: dict[int, Prediction]) -> list[tuple[int, float]]:
    """(processes, samples/s) pairs, as `sched.throughput.ThroughputModel.from_throughput`
    takes them."""
    return [(n, p.samples_per_s) for n, p in sorted(predictions.items())]


if __name__ == "__main__":
    from tandem.analyze.scaling_cli import main

    raise SystemExit(main())
