"""Run a function on N real processes joined by a gloo process group, with a timeout."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

# Ports for the groups' stores: below the kernel's ephemeral range (32768-60999 here) and
# above Ray's worker ports (10002-19999). A port the kernel hands out for "any port" is
# free when asked but not when rank 0 binds it seconds later: outgoing connections and
# other services' "any port" (a Ray head's agents, in the other lane) draw from the same
# range, and one such collision hung a group's rendezvous in a suite run.
STORE_PORTS = range(20000, 32000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the ranges
    that other processes draw from (STORE_PORTS)."""
    for port in random.Random().sample(STORE_PORTS, 64):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # every one taken: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child(fn: Callable[..., Any], rank: int, world: int, port: int, args: tuple,
           errors: Any) -> None:
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
    })
    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key)
    import torch

    torch.set_num_threads(1)
    try:
        fn(rank, world, *args)
    except BaseException:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout: float = 90) -> None:
    """Call fn(rank, world, *args) in `world` fresh processes; raise if any fails or hangs."""
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, args, errors))
             for r in range(world)]
    try:
        for proc in procs:
            proc.start()
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
    finally:
        # Also when the test's own timeout interrupts the wait: no rank outlives the call.
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
    if hung:
        raise TimeoutError(f"ranks {hung} did not finish within {timeout} s")
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        detail = "\n".join(errors.get() for _ in range(errors.qsize())) if errors.qsize() else ""
        raise RuntimeError(f"ranks {failed} failed\n{detail}")
