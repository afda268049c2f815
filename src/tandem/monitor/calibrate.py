"""Short measurements taken once per run: FLOPs, the device's peak, the link's cost.

Exposed communication is not calibrated here: every step measures it in-band (the time
backward waits after a rank's last gradient is ready, `PHASES`' comm_tail), and the
monitor splits it into wire time and the wait for slower ranks. What is measured here
is what that split needs: the all-reduce's latency and bandwidth on this group (the
cost of a buffer of n bytes: latency + n / bandwidth), from paired timings at two sizes
with the ranks aligned before each pair, so a late rank is not counted as wire.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_ALLREDUCE_RATE_HIGH,
    COMM_ALLREDUCE_RATE_LOW,
    COMM_LATENCY,
    FLOPS_PEAK,
    FLOPS_PEAK_MEASURED,
    FLOPS_PER_RANK_STEP,
)
from tandem.monitor.flops import count_flops, keep_flops, kept_flops, peak_flops

Pass = Callable[[bool], None]  # run one forward+backward, synchronising gradients or not
SMALL_BYTES = 4096  # the latency probe's buffer
REPEATS = 3  # pairs of timings: few enough to keep the probe a small share of a short
# run (benchmarks/calibration_cost.py); their range is recorded as the bandwidth's spread


AllReduce = Callable[[torch.Tensor], object]  # sum in place over the group


def _timed(buffer: torch.Tensor, device: torch.device, all_reduce: AllReduce) -> float:
    """One all-reduce of `buffer`, timed on this rank's wall clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    all_reduce(buffer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def link_cost(nbytes: int, device: torch.device, repeats: int = REPEATS,
              all_reduce: AllReduce = dist.all_reduce) -> dict[str, float]:
    """All-reduce latency (s) and algorithmic bandwidth (buffer bytes/s) of this group,
    from `repeats` pairs of timings at a small size and at `nbytes`, with the spread of
    the bandwidth over the pairs. All ranks. `all_reduce`: the path the gradients take
    (the process group's, or the host's shared memory).

    Before each pair the ranks are aligned, so a late rank is not counted as wire: on the
    process group by its barrier (the small all-reduce then aligns them for the big one:
    the ranks leave a collective within one message of each other); on another path by
    an untimed small all-reduce of its own (it ends only when every rank has entered it,
    as a barrier does; a barrier of the process group would leave its own skew, more
    than the big buffer's cost on a path as fast as the host's shared memory).

    The latency is the small buffer's median time less its transfer at the fastest pair's
    rate. A core taken away mid-pair only lengthens a timing: lengthening the big one
    lowers that pair's rate (at the median rate it can push the 4 KB transfer past the
    small buffer's whole time, a latency of zero, which tells the scaling model messages
    cost nothing); lengthening the small one raises it, which moves the latency by less
    than the 4 KB transfer. Where every pair's big buffer was lengthened so much that
    even the fastest rate leaves nothing, the small buffer's fastest time stands in (an
    upper bound on the latency; at 4 KB almost all of it is).
    """
    big_n = max(nbytes, 16 * SMALL_BYTES) // 4
    small = torch.zeros(SMALL_BYTES // 4, dtype=torch.float32, device=device)
    big = torch.zeros(big_n, dtype=torch.float32, device=device)
    all_reduce(small)
    all_reduce(big)  # warm the path and its buffers once, unmeasured
    t_small, t_big = [], []
    for _ in range(repeats):
        if all_reduce is dist.all_reduce:  # every rank starts together: the link's time
            dist.barrier()
        else:
            all_reduce(small)  # untimed, on the same path
        t_small.append(_timed(small, device, all_reduce))
        t_big.append(_timed(big, device, all_reduce))
    span = (big.numel() - small.numel()) * 4
    rates = sorted(span / max(b - s, 1e-9) for s, b in zip(t_small, t_big, strict=True))
    rate = statistics.median(rates)
    latency = statistics.median(t_small) - small.numel() * 4 / rates[-1]
    if latency <= 0:
        latency = min(t_small)
    return {COMM_LATENCY: latency, COMM_ALLREDUCE_RATE: rate,
            COMM_ALLREDUCE_RATE_LOW: rates[0],
            COMM_ALLREDUCE_RATE_HIGH: rates[-1]}


def calibrate(run: Pass, *, device: torch.device, world_size: int, accum: int,
              grad_bytes: int, precision: str, communicates: bool,
              signature: str | None = None,
              all_reduce: AllReduce = dist.all_reduce,
              spent: dict[str, float] | None = None) -> dict[str, float]:
    """Every once-per-run figure, as metric name -> value. All ranks.

    `communicates`: gradients or weights cross the group (the link's cost is measured).
    `signature`: what the step's FLOP count depends on (`flops.step_signature`), to read
    a count kept from an earlier run of the same step instead of counting again.
    `all_reduce`: the path the gradients take, whose cost is measured.
    `spent`: filled with this rank's seconds per part ("flops": reading or counting the
    FLOPs, "peak": the device's peak, "link": the link's cost), for the run's summary.
    """
    figures: dict[str, float] = {}
    spent = {} if spent is None else spent
    started = time.perf_counter()
    flops = kept_flops(signature)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        # Every rank counts, or none: the counting pass can hold collectives (FSDP's
        # gathers, tensor parallelism), and ranks on other nodes keep other caches.
        every = torch.tensor([0 if flops is None else 1], device=device)
        all_reduce(every)  # a sum, on the gradients' path (the cheaper one where it is)
        if every.item() < dist.get_world_size():
            flops = None
    if flops is None:
        flops = count_flops(lambda: run(False))
        keep_flops(signature, flops)
    spent["flops"] = time.perf_counter() - started
    started = time.perf_counter()
    peak, source = peak_flops(device, precision)
    spent["peak"] = time.perf_counter() - started
    figures[FLOPS_PER_RANK_STEP] = float(flops * accum)
    if peak > 0:
        figures[FLOPS_PEAK] = peak
        figures[FLOPS_PEAK_MEASURED] = 1.0 if source.startswith("measured") else 0.0
    if world_size > 1 and communicates:
        started = time.perf_counter()
        figures.update(link_cost(grad_bytes, device, all_reduce=all_reduce))
        spent["link"] = time.perf_counter() - started
    return figures
