"""The machines a plan is made for: devices, their memory and speed, and the links.

A preset names a common shape (`8xH100-80GB`: one node of eight; `64xH100-80GB`: eight
nodes of eight); `cpu` is this host, one process per core, its measured matmul rate.
Data-sheet rates are dense bf16 peaks and HBM bandwidths; links are per device, one way.

Besides its bytes, each collective costs a fixed time: on GPUs NCCL's small-message
latency (about 30 us within a node), run on the device's own engine beside the compute;
on this host what `host_probe` measures between steps of real work (gloo's wake-ups and
the peers' arrival, several milliseconds on a busy 2-core host), spent on the cores the
compute needs, so it adds to the step.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass

import psutil

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class Machine:
    """`devices` in nodes of `per_node`, each with `memory` bytes and `peak` FLOP/s;
    `intra` and `inter` the bytes/s a device sends within and across nodes."""

    name: str
    devices: int
    per_node: int
    memory: float
    peak: float
    intra: float
    inter: float
    collective_s: float = 0.0  # fixed seconds per collective, besides its bytes
    memory_bw: float = math.inf  # bytes/s an elementwise step moves through memory
    overlaps: bool = True  # communication runs beside the compute (GPU), not on its cores

    @property
    def nodes(self) -> int:
        return -(-self.devices // self.per_node)


# kind: (memory bytes, bf16 peak FLOP/s, NVLink bytes/s per device, network bytes/s per
# device, HBM bytes/s)
GPUS = {
    "H100-80GB": (80 * GIB, 989e12, 450 * GB, 50 * GB, 3350 * GB),
    "H100-96GB": (96 * GIB, 989e12, 450 * GB, 50 * GB, 3900 * GB),
    "H200-141GB": (141 * GIB, 989e12, 450 * GB, 50 * GB, 4800 * GB),
    "A100-80GB": (80 * GIB, 312e12, 300 * GB, 25 * GB, 2039 * GB),
    "A100-40GB": (40 * GIB, 312e12, 300 * GB, 25 * GB, 1555 * GB),
}
PER_NODE = 8
NCCL_LATENCY_S = 30e-6


def parse_machine(text: str) -> Machine:
    """`NxKIND` (e.g. 8xH100-80GB, 64xA100-40GB; nodes of 8) or `cpu` (this host)."""
    if text == "cpu":
        return this_host()
    match = re.fullmatch(r"(\d+)x(.+)", text)
    if not match or match.group(2) not in GPUS or int(match.group(1)) < 1:
        raise ValueError(f"--machine {text!r}: give NxKIND with KIND one of "
                         f"{', '.join(GPUS)} (e.g. 8xH100-80GB), or cpu")
    count = int(match.group(1))
    memory, peak, intra, inter, hbm = GPUS[match.group(2)]
    return Machine(text, count, min(count, PER_NODE), memory, peak, intra, inter,
                   collective_s=NCCL_LATENCY_S, memory_bw=hbm)


def this_host() -> Machine:
    """One process per core; each gets an equal share of the memory; the matmul rate
    measured here with one thread (fp32) is each one's peak; gloo over loopback, each
    collective's fixed cost and the memory rate measured (`host_probe`)."""
    import torch

    from tandem.monitor.flops import peak_flops
    from tandem.planner.host_probe import collective_seconds, memory_bytes_per_s

    cores = len(os.sched_getaffinity(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker runs (`tandem run` gives each one thread)
    try:
        peak, _ = peak_flops(torch.device("cpu"), "fp32")
    finally:
        torch.set_num_threads(threads)
    memory = psutil.virtual_memory().total / cores
    return Machine("cpu", cores, cores, memory, peak, 2 * GB, 2 * GB,
                   collective_s=collective_seconds(min(cores, 8)),
                   memory_bw=memory_bytes_per_s(), overlaps=False)
