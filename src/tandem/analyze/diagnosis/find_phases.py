"""Findings about where a step's time goes: input, communication, waiting, compute.

Each one that names a cause states the gain its removal predicts (the step time over the
step time without that phase) and the control experiment that would remove it.
"""

from __future__ import annotations

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import (
    IN_MEMORY_DATA,
    NO_COMM,
    Context,
    Finding,
    severity,
    share,
)
from tandem.analyze.report.figures import PHASES, series_of, steady, steady_median
from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_LATENCY,
    MFU,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_H2D,
    TIME_STEP,
    TIME_SYNC_WAIT,
    TIME_WIRE_PREDICTED,
)
from tandem.monitor.commsplit import beyond_wire

INPUT_BOUND_SHARE = 0.20
H2D_SHARE = 0.10  # host-to-device copies this large suggest pinned memory (GPU only)
COMM_BOUND_SHARE = 0.25
WAIT_SHARE = 0.15
COMPUTE_BOUND_SHARE = 0.70


def input_bound(ctx: Context) -> Finding | None:
    """Data wait above INPUT_BOUND_SHARE of the step."""
    data = share(ctx.groups, TIME_DATA)
    if data is None or data.share <= INPUT_BOUND_SHARE:
        return None
    workers, prefetch = ctx.cfg("data.workers"), ctx.cfg("data.prefetch")
    more_workers = f"{workers} -> {max(2, 2 * workers)}" if isinstance(workers, int) else "more"
    deeper = f"{prefetch} -> {2 * prefetch}" if isinstance(prefetch, int) else "deeper"
    suggestions = [f"data.workers {more_workers}: more loader processes per rank",
                   f"data.prefetch {deeper}: more batches loaded ahead of the step"]
    evidence = data.evidence()
    h2d = share(ctx.groups, TIME_H2D)
    if h2d is not None and ctx.on_gpu:
        evidence["h2d_share"] = h2d.share
        if h2d.share > H2D_SHARE:
            suggestions.append(f"data.pin_memory true: host-to-device copies take "
                               f"{h2d.quote()}")
    suggestions.append("move decoding/augmentation off the step (cache decoded samples)")
    gain = data.speedup_without
    return Finding(
        "input-bound", severity(data.share, INPUT_BOUND_SHARE), evidence,
        f"data wait is {data.quote()}; with batches ready at once the step would be "
        f"{gain:.2f}x faster -> the loader does not keep up: try more workers "
        f"(data.workers), deeper prefetch (data.prefetch) or cheaper preprocessing",
        suggestions, predicted_speedup=gain, control=IN_MEMORY_DATA)


def communication_bound(ctx: Context) -> Finding | None:
    """Exposed wire time (what no rank could hide) above COMM_BOUND_SHARE of the step."""
    comm = share(ctx.groups, TIME_COMM_EXPOSED)
    if comm is None or comm.share <= COMM_BOUND_SHARE:
        return None
    wire = steady_median(ctx.groups, TIME_WIRE_PREDICTED)
    gain = comm.speedup_without
    evidence = {**comm.evidence(), "wire_predicted_s": wire}
    head = (f"exposed communication is {comm.quote()}; without it the step would be "
            f"{gain:.2f}x faster")
    meet_less = ("plan.strategy localsgd or diloco: meet every plan.sync_every steps "
                 "instead of every step, or streaming_diloco: meet in parts, each hidden "
                 "behind inner steps (check convergence)")
    if wire is not None and beyond_wire(comm.phase_s, wire):
        evidence["beyond_wire_s"] = comm.phase_s - wire
        where = "the GPU's streams" if ctx.on_gpu else "the CPU cores"
        return Finding(
            "communication-bound", severity(comm.share, COMM_BOUND_SHARE), evidence,
            f"{head}; but the link moves this step's gradients in {wire * 1e3:.2g} ms, so "
            f"{(comm.phase_s - wire) * 1e3:.2g} ms of it is not the wire: the collective "
            f"waits for {where} it shares with compute -> fewer meetings help, fewer bytes "
            "do not",
            [meet_less, "fewer processes than cores, so communication threads get a core "
                        "of their own"],
            predicted_speedup=gain, control=NO_COMM)
    return Finding(
        "communication-bound", severity(comm.share, COMM_BOUND_SHARE), evidence,
        f"{head} -> try gradient compression (plan.comm_hook fp16/powersgd), larger "
        "buckets (plan.bucket_mb), or local SGD",
        ["plan.comm_hook fp16 or powersgd: fewer bytes per all-reduce",
         _bucket_advice(ctx), meet_less],
        predicted_speedup=gain, control=NO_COMM)


def _bucket_advice(ctx: Context) -> str:
    """A bucket large enough that the all-reduce's latency is paid on few bytes."""
    latency = steady_median(ctx.groups, COMM_LATENCY)
    rate = steady_median(ctx.groups, COMM_ALLREDUCE_RATE)
    bucket = ctx.cfg("plan.bucket_mb")
    if latency and rate:
        floor_mb = 4 * latency * rate / 2**20  # latency at most a fifth of a bucket's time
        return (f"plan.bucket_mb >= {floor_mb:.2g}: a bucket of latency x bandwidth bytes "
                f"costs as much in latency ({latency * 1e3:.2g} ms) as on the wire")
    bigger = f"{bucket:g} -> {4 * bucket:g}" if isinstance(bucket, int | float) else "larger"
    return f"plan.bucket_mb {bigger}: fewer, larger all-reduces that overlap better"


def waiting_for_peers(ctx: Context) -> Finding | None:
    """Ranks waiting for slower peers above WAIT_SHARE of the step."""
    wait = share(ctx.groups, TIME_SYNC_WAIT)
    if wait is None or wait.share <= WAIT_SHARE:
        return None
    gain = wait.speedup_without
    return Finding(
        "waiting-for-peers", severity(wait.share, WAIT_SHARE), wait.evidence(),
        f"ranks wait {wait.quote()} for slower peers at the gradient collective; were "
        f"the ranks even, the step would be {gain:.2f}x faster -> uneven work, data or "
        "hardware across ranks, not the link",
        ["see the per-rank straggler scores: the rank with the longest own time makes "
         "the others wait",
         "data.workers: a rank short of loader processes arrives late",
         "uneven samples (lengths, decode cost): balance what each rank gets"],
        predicted_speedup=gain)


def compute_bound(ctx: Context) -> Finding | None:
    """Compute above COMPUTE_BOUND_SHARE of the step (and nothing else fired)."""
    compute = share(ctx.groups, TIME_COMPUTE)
    if compute is None or compute.share <= COMPUTE_BOUND_SHARE:
        return None
    _, mfu_values = steady(*series_of(ctx.groups, MFU))
    mfu = stats.finite(mfu_values)
    evidence = compute.evidence()
    if mfu:
        evidence["mfu"] = stats.median(mfu)
        mfu_text = f", MFU {evidence['mfu']:.0%}"
    else:
        mfu_text = " (MFU unknown: no peak for this device)"
    suggestions = []
    accumulation = ctx.accumulation
    if accumulation is not None and accumulation > 1:  # without accumulation: no fewer
        suggestions.append(f"train.micro_batch larger (fewer than {accumulation} accumulation "
                           "steps) if memory allows: bigger kernels run closer to peak")
    if ctx.on_gpu and ctx.cfg("precision.mode") in (None, "fp32"):
        suggestions.insert(0, "precision.mode bf16: tensor cores and half the bytes")
    return Finding(
        "compute-bound", "low", evidence,
        f"compute is {compute.quote()}{mfu_text} -> the device is the limit, as it should "
        f"be; faster only with less work per sample or faster kernels",
        suggestions)


def balanced(ctx: Context) -> Finding | None:
    """No phase stands out: the shares of a step, for the record."""
    _, step_values = steady(*series_of(ctx.groups, TIME_STEP))
    step_values = stats.finite(step_values)
    if not step_values:
        return None
    step_s = stats.median(step_values)
    shares = {label: s.share for name, label in PHASES
              if (s := share(ctx.groups, name)) is not None}
    if shares:
        shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    parts = ", ".join(f"{label} {value:.0%}" for label, value in shares.items())
    return Finding(
        "balanced", "info", {"step_s": step_s, "shares": shares},
        f"no phase stands out ({parts or 'no phase timings'} of {step_s:.3g} s per step)",
        [])


def phase_sum(ctx: Context) -> float | None:
    """The measured phases' shares of the step, added up (None without timings)."""
    shares = [s.share for name, _ in PHASES if (s := share(ctx.groups, name)) is not None]
    return sum(shares) if shares else None
