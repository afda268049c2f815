"""Exposed communication, split into what the wire costs and what ranks wait for.

Every rank measures, each step, the communication on its critical path: the time its
backward waited after its own last gradient was ready (DDP's all-reduce of the last
buckets, `comm_tail`) plus communication outside backward (`comm`: a tensor-parallel
gradient all-reduce, a local-SGD meeting). All ranks leave a collective at about the
same moment, so a rank that got there first waited longer: the rank that arrived last
waited only for the wire. Hence, per window,

    exposed wire   = min over ranks of the exposed time     (no rank could avoid it)
    sync wait, r   = rank r's exposed time - exposed wire   (waiting for slower peers)

Their remedies differ: compression, buckets or fewer meetings for the wire; balancing
work and fixing stragglers for the wait. No clock has to agree across ranks.

The wire's predicted cost comes from the link's measured latency and bandwidth
(`calibrate.link_cost`): buckets x latency + buffer bytes / bandwidth per step. An exposed
figure well above it is not the network: on CPU, the communication threads and the
compute compete for the same cores.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_BUCKETS_PER_STEP,
    COMM_BYTES_PER_STEP,
    COMM_LATENCY,
    TIME_COMM_BEYOND_WIRE,
    TIME_COMM_EXPOSED,
    TIME_SYNC_WAIT,
    TIME_WIRE_PREDICTED,
)

# Exposed time beyond this multiple of the predicted wire time (and ABOVE_WIRE_S) is
# not explained by the wire.
ABOVE_WIRE_RATIO = 1.5
ABOVE_WIRE_S = 0.5e-3


def split(exposed_s: Sequence[float]) -> tuple[float, list[float]]:
    """(exposed wire, each rank's sync wait) from each rank's exposed seconds per step."""
    floor = min(exposed_s)
    return floor, [e - floor for e in exposed_s]


def wire_seconds(figures: Mapping[str, float], world: int) -> float | None:
    """Predicted seconds per step on the wire (None without a measured link).

    `figures` holds comm/latency_s, comm/allreduce_bytes_per_s (buffer bytes per second
    of an all-reduce), comm/bytes_per_step (bytes each rank sends, ring-counted) and
    comm/buckets_per_step (collectives per step).
    """
    latency = figures.get(COMM_LATENCY)
    rate = figures.get(COMM_ALLREDUCE_RATE)
    sent = figures.get(COMM_BYTES_PER_STEP)
    if latency is None or not rate or sent is None or world < 2:
        return None
    buffer = sent / (2 * (world - 1) / world)  # a ring all-reduce sends 2(N-1)/N of it
    return figures.get(COMM_BUCKETS_PER_STEP, 1.0) * latency + buffer / rate


def rows(exposed_s: Sequence[float], figures: Mapping[str, float],
         world: int) -> dict[str, float]:
    """The window's job-wide communication figures (see the module docstring)."""
    wire, waits = split(exposed_s)
    out = {TIME_COMM_EXPOSED: wire, TIME_SYNC_WAIT: statistics.fmean(waits)}
    predicted = wire_seconds(figures, world)
    if predicted is not None:
        out[TIME_WIRE_PREDICTED] = predicted
        out[TIME_COMM_BEYOND_WIRE] = max(0.0, wire - predicted)
    return out


def beyond_wire(exposed_wire: float, predicted: float) -> bool:
    """Whether exposed communication is far more than the wire can explain."""
    return exposed_wire > ABOVE_WIRE_RATIO * predicted + ABOVE_WIRE_S
