"""What a collective and the optimizer's memory traffic cost on this host, measured.

A collective between processes on a CPU host costs more than its bytes: the peers arrive
at different times and each wakes a sleeping thread (its own, gloo's) on a core another
process is using. Measured back to back after a barrier, a small gloo collective takes
0.2-0.5 ms here; between steps of real work it takes several times that. So the probe
measures it the way a training step meets it: `processes` ranks, one thread each, each
doing a few milliseconds of matmuls and then one small all-reduce, against the same work
without it; the difference per round is one collective's cost (the median of rounds of
such loops). The bytes' own cost is the link's rate, priced apart.

The memory rate is a large copy's, in this process: what an elementwise optimizer step
moves per parameter.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROUNDS = 5  # loops each way per measurement (the median counts)
PER_LOOP = 40  # work + collective rounds per loop
MATMULS = 12  # 256 x 256 matmuls of work per round (about 4 ms on one core)


def collective_seconds(processes: int = 2, timeout_s: float = 60.0) -> float:
    """Seconds one small collective adds to a step of `processes` one-thread ranks here."""
    if processes < 2:
        return 0.0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = mp.get_context("spawn").SimpleQueue()
    ctx = mp.start_processes(_rank, args=(processes, port, result), nprocs=processes,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"the collective probe of {processes} processes did not "
                               f"finish in {timeout_s:.0f} s")
    return float(result.get())


def _rank(rank: int, world: int, port: int, result: object) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        a = torch.randn(256, 256)
        token = torch.ones(16)

        def loop(collective: bool) -> float:
            dist.barrier()
            started = time.perf_counter()
            for _ in range(PER_LOOP):
                for _ in range(MATMULS):
                    a @ a
                if collective:
                    dist.all_reduce(token)
            return (time.perf_counter() - started) / PER_LOOP

        loop(True)  # warm-up: connections, allocations
        added = [loop(True) - loop(False) for _ in range(ROUNDS)]
        cost = torch.tensor([max(0.0, statistics.median(added))], dtype=torch.float64)
        dist.all_reduce(cost, op=dist.ReduceOp.MAX)
        if rank == 0:
            result.put(float(cost))
    finally:
        dist.barrier()  # gloo's thread done with every tensor before the group goes
        dist.destroy_process_group()


def memory_bytes_per_s(nbytes: int = 64 * 2**20) -> float:
    """Bytes/s a one-thread copy moves here (read and write counted)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes // 4)
        dst = torch.empty_like(src)
        dst.copy_(src)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - started)
        return 2 * nbytes / min(times)
    finally:
        torch.set_num_threads(threads)
