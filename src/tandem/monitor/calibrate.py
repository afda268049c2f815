"""Short measurements taken once per run: exposed communication, FLOPs, peak, bandwidth.

Exposed communication is measured by experiment, not inferred: the same micro-batch is
run forward and backward k times with gradient synchronisation and k times without
(DDP's no_sync), interleaved; the difference of the medians is the communication that
overlap with the backward pass failed to hide. The passes change no parameter (no
optimizer step; gradients are cleared and module buffers restored afterwards), so the
run trains exactly as it would have without them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from tandem.monitor.flops import count_flops, peak_flops

Pass = Callable[[bool], None]  # run one forward+backward, synchronising gradients or not


def _timed(run: Pass, sync: bool, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    run(sync)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def exposed_comm(run: Pass, device: torch.device, repeats: int = 3) -> dict[str, float]:
    """Median seconds of a synchronised and an unsynchronised pass, and their difference.

    Must be called on all ranks (the synchronised passes are collectives).
    """
    run(True)  # warm the communication path once, unmeasured (the local one is warm)
    synced, local = [], []
    for _ in range(repeats):
        synced.append(_timed(run, True, device))
        local.append(_timed(run, False, device))
    with_comm, without = statistics.median(synced), statistics.median(local)
    return {"calib/pass_sync_s": with_comm, "calib/pass_local_s": without,
            "time/comm_exposed": max(0.0, with_comm - without)}


def allreduce_bandwidth(nbytes: int, device: torch.device, repeats: int = 5) -> float:
    """Algorithmic all-reduce bandwidth (bytes/s) for a buffer of `nbytes`. All ranks."""
    buffer = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(buffer)
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        dist.all_reduce(buffer)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return buffer.numel() * 4 / statistics.median(times)


def calibrate(run: Pass, *, device: torch.device, world_size: int, accum: int,
              grad_bytes: int, precision: str, synchronised: bool) -> dict[str, float]:
    """Every once-per-run figure, as metric name -> value. All ranks.

    `synchronised`: gradients are all-reduced every step (DDP). Low-communication
    replicas report their meetings' cost per window instead.
    """
    figures: dict[str, float] = {}
    flops = count_flops(lambda: run(False))
    peak, source = peak_flops(device, precision)
    figures["flops/per_rank_step"] = float(flops * accum)
    figures["flops/peak"] = peak
    figures["flops/peak_measured"] = 1.0 if source.startswith("measured") else 0.0
    if world_size > 1 and synchronised:
        figures.update(exposed_comm(run, device))
        # A ring all-reduce sends 2 (N-1)/N of the buffer from every rank.
        figures["comm/bytes_per_step"] = 2 * (world_size - 1) / world_size * grad_bytes
        figures["comm/allreduce_bytes_per_s"] = allreduce_bandwidth(grad_bytes, device)
    elif world_size == 1:
        figures["time/comm_exposed"] = 0.0
        figures["comm/bytes_per_step"] = 0.0
    return figures
