"""Throughput at other process counts, predicted from one run's measured phases.

A data-parallel step (DDP or one process) on rank r is, in wall-clock seconds,

    step = compute + data + optim + other + exposed communication + sync wait

and each term is rebuilt at N processes from what the one run measured at N0:

- **Work** (compute, data, optim, the loop's own overhead "other") is turned into
  seconds on a dedicated core by the CPU share the run had, then divided by the share
  at N. compute and data scale with the samples each rank handles per step (the global
  batch is the contract: B / N per rank, as k micro-batches of m); optim and other are
  per step (DDP replicates the optimizer). Per-micro-batch overhead is not separated
  from per-sample cost: the interval widens with |log2(m / m0)|.
- **CPU share** (`cpu_share`): one thread per process, C cores, and `background`
  foreign CPU-bound threads: every runnable thread gets min(1, C / (N + background))
  of a core while the N ranks compute together (the kernel's fair share). The
  background is estimated from the run itself: the host's CPU utilisation and rank 0's
  process CPU in each window (`background_threads`). Four processes on two idle
  cores each get half a core; beside three busy foreign threads one process gets 0.5
  of a core and four get 0.29 each. On CUDA the devices are shared instead: min(1, G / N).
- **Exposed communication** (`CommModel`): a ring all-reduce of n buffer bytes in b
  buckets takes 2(N-1) hops, each paying the hop latency and, on a loaded CPU, the wait
  to be scheduled among the foreign threads (wake x background / C per hop), and each
  rank sends 2(N-1)/N x n bytes, plus the bucket copies in and out; the bytes' CPU
  work is divided by the CPU share. A multi-process run fits each part to what it
  measured (the link's calibrated latency and bandwidth, then the in-band exposed time
  apportioned to the wait and the copies); a one-process run has no link measurement
  and uses the priors below.
- **Sync wait**: ranks leave a collective together, so the mean wait is
  E[max of N] - E[mean] of their arrival times: sigma x e(N), with e(N) the expected
  maximum of N standard normals and sigma proportional to the work before the
  collective (from the run's measured wait; a prior at N0 = 1).

What is not modelled: FSDP, local SGD / DiLoCo, tensor parallelism, batch ramps, data
loader workers' own CPU demand, memory limits, several nodes. A prediction holds for the
background the run saw; the interval spans the background's quartiles over the run's
windows and each term's stated uncertainty, not a change of the machine's load after it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from statistics import NormalDist, median

# Priors for a link the run did not measure (a one-process run). CPU: gloo over
# loopback on this kind of machine (DESIGN.md: ~0.4 ms for a 0.1 MiB all-reduce on 2
# processes, ~1 GiB/s algorithmic bandwidth); CUDA: NCCL within one node.
CPU_LINK = {"hop_latency_s": 150e-6, "link_bytes_per_s": 2**30,
            "wake_s": 2.5e-3, "local_bytes_per_s": 2e9}
CUDA_LINK = {"hop_latency_s": 20e-6, "link_bytes_per_s": 20e9,
             "wake_s": 0.0, "local_bytes_per_s": 200e9}
HOOK_BYTES = {"none": 1.0, "fp16": 0.5, "bf16": 0.5}  # buffer bytes per gradient byte
SATURATED = 0.95  # host CPU utilisation above which every core is taken
# A rank's spread in arrival time relative to its work, for a one-process run (which
# cannot tell): multi-process runs on this machine measured 2-7%. A one-process run's
# step-time spread is no guide: most of it is load that all ranks would share.
DEFAULT_JITTER = 0.04
# Relative uncertainty of each term (one standard deviation, as judged from the model's
# assumptions): compute per sample grows this much per halving/doubling of the
# micro-batch; communication fitted from the run vs from priors; the sync wait.
U_WORK, U_PER_OCTAVE, U_STEP = 0.04, 0.06, 0.10
U_COMM_FIT, U_COMM_PRIOR, U_WAIT = 0.30, 0.60, 0.50


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


@cache
def expected_max(n: int) -> float:
    """E[max] of n independent standard normals (0 for n = 1)."""
    if n <= 1:
        return 0.0
    unit, steps, lo, hi = NormalDist(), 2000, -8.0, 8.0
    width = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * width
        weight = 0.5 if i in (0, steps) else 1.0
        total += weight * x * n * unit.pdf(x) * unit.cdf(x) ** (n - 1)
    return total * width


def cpu_share(n: int, cores: int, background: float) -> float:
    """The share of a core each of n CPU-bound ranks gets beside `background` threads."""
    return min(1.0, cores / (n + max(0.0, background)))


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
    """The fraction of a step rank 0 is runnable (not blocked in a collective)."""
    if fig.step_s <= 0:
        return 1.0
    blocked = (fig.comm_exposed_s + fig.sync_wait_s) / fig.step_s
    return min(1.0, max(0.2, 1.0 - blocked))


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


@dataclass(frozen=True, kw_only=True)
class CommModel:
    """Exposed all-reduce seconds per step at any size (see the module docstring)."""

    buffer_bytes: float
    buckets: float
    hop_latency_s: float
    link_bytes_per_s: float
    wake_s: float
    local_bytes_per_s: float
    exposure: float = 1.0
    """Fraction of the all-reduce not hidden behind backward."""
    fitted: bool = False

    def parts(self, n: int, share: float, background: float,
              cores: int) -> tuple[float, float]:
        """(per-hop seconds, per-byte seconds) of one step's all-reduces at n ranks."""
        if n <= 1:
            return 0.0, 0.0
        hops = 2 * (n - 1) * self.buckets
        per_hop = hops * (self.hop_latency_s + self.wake_s * max(0.0, background) / cores)
        sent = 2 * (n - 1) / n * self.buffer_bytes
        per_byte = (sent / self.link_bytes_per_s
                    + self.buffer_bytes / self.local_bytes_per_s) / share
        return per_hop, per_byte

    def exposed(self, n: int, share: float, background: float, cores: int) -> float:
        """Exposed seconds per step at n ranks."""
        return self.exposure * sum(self.parts(n, share, background, cores))


def comm_model(fig: RunFigures, background: float) -> CommModel:
    """The run's communication, fitted to what it measured when it had several ranks."""
    prior = CUDA_LINK if fig.device == "cuda" else CPU_LINK
    n0 = fig.world_size
    if n0 > 1 and fig.bytes_per_step:
        buffer = fig.bytes_per_step / (2 * (n0 - 1) / n0)
    else:
        if fig.comm_hook not in HOOK_BYTES:
            raise ValueError(f"plan.comm_hook {fig.comm_hook!r}: a one-process run cannot "
                             f"tell its bytes; modelled: {', '.join(HOOK_BYTES)}")
        buffer = fig.grad_bytes * HOOK_BYTES[fig.comm_hook]
    buckets = fig.buckets_per_step or max(1.0, math.ceil(buffer / fig.bucket_bytes))
    link = dict(prior)
    if n0 > 1 and fig.latency_s is not None and fig.allreduce_bytes_per_s:
        link["hop_latency_s"] = fig.latency_s / (2 * (n0 - 1))
        link["link_bytes_per_s"] = fig.allreduce_bytes_per_s * 2 * (n0 - 1) / n0
    model = CommModel(buffer_bytes=buffer, buckets=buckets, **link)
    if n0 <= 1:
        return replace(model, exposure=_overlap(model, fig, background))
    return _fit_exposed(model, fig, background)


def _overlap(model: CommModel, fig: RunFigures, background: float) -> float:
    """Exposed fraction without a measurement: the last bucket's all-reduce is exposed,
    the earlier ones hide behind the backward that follows them, as far as it lasts."""
    if model.buckets <= 1:
        return 1.0
    n = 2 if fig.device == "cpu" else min(2, max(fig.devices, 1))
    total = model.exposed(n, cpu_share(n, fig.cores, background), background, fig.cores)
    earlier = total * (model.buckets - 1) / model.buckets
    hidden = min(earlier, fig.backward_s * (model.buckets - 1) / model.buckets)
    return max(1.0 / model.buckets, 1.0 - hidden / total) if total > 0 else 1.0


def _fit_exposed(model: CommModel, fig: RunFigures, background: float) -> CommModel:
    """Scale the parts the calibration cannot see (the wait to be scheduled, the bucket
    copies) so that the model gives the exposed time the run measured at N0."""
    n0, cores = fig.world_size, fig.cores
    share = _share(fig, n0, background)
    hops = 2 * (n0 - 1) * model.buckets
    sent = 2 * (n0 - 1) / n0 * model.buffer_bytes
    wire = hops * model.hop_latency_s + sent / model.link_bytes_per_s / share
    wake = hops * model.wake_s * max(0.0, background) / cores
    local = model.buffer_bytes / model.local_bytes_per_s / share
    measured = fig.comm_exposed_s
    if measured >= wire:
        scale = (measured - wire) / (wake + local) if wake + local > 0 else 0.0
        return replace(model, wake_s=model.wake_s * scale,
                       local_bytes_per_s=model.local_bytes_per_s / max(scale, 1e-9),
                       fitted=True)
    # Less exposed than the bare wire: backward hid the rest.
    return replace(model, wake_s=0.0, local_bytes_per_s=math.inf,
                   exposure=measured / wire if wire > 0 else 1.0, fitted=True)


def _share(fig: RunFigures, n: int, background: float) -> float:
    """The share of a compute unit each of n ranks gets (cores on CPU, devices on CUDA)."""
    if fig.device == "cuda":
        return min(1.0, max(fig.devices, 1) / n)
    return cpu_share(n, fig.cores, background)


def _jitter(fig: RunFigures) -> float:
    """A rank's spread in pre-collective work, relative to that work."""
    pre = fig.compute_s + fig.data_s + fig.other_s
    if pre <= 0:
        return DEFAULT_JITTER
    if fig.world_size > 1:
        return fig.sync_wait_s / expected_max(fig.world_size) / pre
    return DEFAULT_JITTER


def _terms(fig: RunFigures, n: int, source: float, target: float) -> dict[str, float]:
    """Seconds per step of each term at n ranks: the run measured beside `source` foreign
    threads, the prediction is for `target` of them."""
    n0 = fig.world_size
    _, accum = batch_split(fig, n)
    work0, work = _share(fig, n0, source), _share(fig, n, target)
    host0 = cpu_share(n0, fig.cores, source)
    host = cpu_share(n, fig.cores, target)
    per_rank = n0 / n  # each rank's share of the global batch, relative to the run's
    compute = fig.compute_s * per_rank * work0 / work
    data = fig.data_s * per_rank * host0 / host
    other = fig.other_s * host0 / host
    comm = comm_model(fig, source)
    wire = comm.exposed(n, host if fig.device == "cpu" else 1.0, target, fig.cores)
    wait = _jitter(fig) * (compute + data + other) * expected_max(n)
    return {"compute": compute, "data": data, "optim": fig.optim_s * work0 / work,
            "other": other, "wire": wire, "wait": wait, "share": work,
            "accum": float(accum), "fitted": float(comm.fitted)}


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
    def target(source: float) -> float:
        return source if background is None else background

    terms = _terms(fig, n, middle, target(middle))
    step = step_seconds(terms)
    others = [step_seconds(_terms(fig, n, b, target(b))) for b in (lo, hi)]
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
