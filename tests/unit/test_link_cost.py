"""The link probe recovers latency and bandwidth from timings, and a disturbed timing
never turns the latency into zero."""

from __future__ import annotations

import pytest
import torch

from tandem.monitor import calibrate
from tandem.monitor.calibrate import SMALL_BYTES, link_cost

LATENCY, BANDWIDTH = 20e-6, 1e9  # a link of 20 us and 1 GB/s
NBYTES = 64 * 1024


class Link:
    """A fake clock and an all-reduce that costs latency + bytes / bandwidth on it, plus
    `extra[i]` seconds on the i-th timed call (calls alternate small, big per pair)."""

    def __init__(self, extra: dict[int, float]) -> None:
        self.now, self.calls, self.extra = 0.0, 0, extra
        self.small_times: list[float] = []

    def clock(self) -> float:
        return self.now

    def all_reduce(self, buffer: torch.Tensor) -> None:
        cost = LATENCY + buffer.numel() * 4 / BANDWIDTH
        at = self.calls - 2  # two warm-up calls; then per pair: aligner, small, big
        if at >= 0 and at % 3 != 0:
            index = at // 3 * 2 + at % 3 - 1  # 0, 1 (pair 0), 2, 3 (pair 1), ...
            cost += self.extra.get(index, 0.0)
            if index % 2 == 0:
                self.small_times.append(cost)
        self.calls += 1
        self.now += cost


def _probe(monkeypatch: pytest.MonkeyPatch, extra: dict[int, float]) -> tuple[dict, Link]:
    link = Link(extra)
    monkeypatch.setattr(calibrate.time, "perf_counter", link.clock)
    got = link_cost(NBYTES, torch.device("cpu"), repeats=3, all_reduce=link.all_reduce)
    return got, link


def test_an_undisturbed_link_gives_back_its_latency_and_bandwidth(monkeypatch) -> None:
    got, link = _probe(monkeypatch, {})
    assert len(link.small_times) == 3
    assert got["comm/latency_s"] == pytest.approx(LATENCY, rel=1e-6)
    assert got["comm/allreduce_bytes_per_s"] == pytest.approx(BANDWIDTH, rel=1e-6)


def test_big_buffers_slowed_in_most_pairs_leave_the_latency_near_the_truth(
        monkeypatch) -> None:
    # Pairs 0 and 1 lose a core during the big buffer: the median rate drops to a
    # fifteenth of the link's, and the median rate's 4 KB transfer (about 70 us) would
    # exceed the small buffer's whole 24 us: a latency of zero.
    got, _ = _probe(monkeypatch, {1: 1e-3, 3: 2e-3})
    slow_rate = (NBYTES - SMALL_BYTES) / ((NBYTES - SMALL_BYTES) / BANDWIDTH + 1e-3)
    assert SMALL_BYTES / slow_rate > LATENCY + SMALL_BYTES / BANDWIDTH  # the trap is real
    assert got["comm/allreduce_bytes_per_s"] == pytest.approx(slow_rate, rel=1e-6)
    assert got["comm/latency_s"] == pytest.approx(LATENCY, rel=1e-6)


def test_every_pair_disturbed_gives_the_small_buffers_fastest_time(monkeypatch) -> None:
    got, link = _probe(monkeypatch, {1: 1e-3, 3: 2e-3, 5: 1.5e-3, 4: 5e-6})
    assert got["comm/latency_s"] == pytest.approx(min(link.small_times), rel=1e-6)
    assert LATENCY < got["comm/latency_s"] <= LATENCY + SMALL_BYTES / BANDWIDTH
