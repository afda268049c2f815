"""One process's logging window: rates from the samples actually used, the update ratio."""

from __future__ import annotations

import math

import pytest
import torch

from tandem.monitor.live import LiveMonitor


def _monitor(log_every: int) -> LiveMonitor:
    return LiveMonitor(device=torch.device("cpu"), rank=0, world_size=1, log_every=log_every,
                       tokens_per_sample=None)


def test_update_ratio_is_the_norm_of_the_change_over_the_weights() -> None:
    monitor = _monitor(2)
    params = [torch.nn.Parameter(torch.tensor([3.0, 4.0])), torch.nn.Parameter(torch.ones(3))]
    assert not monitor.wants_update_ratio(0) and monitor.wants_update_ratio(1)
    monitor.step(torch.tensor(1.0), torch.tensor(0.5), 0.01, 32)
    before = monitor.snapshot(params)
    with torch.no_grad():
        params[0].add_(torch.tensor([0.3, 0.0]))
        params[1].sub_(0.1)
    monitor.update_sizes(before, params)
    monitor.step(torch.tensor(3.0), torch.tensor(0.5), 0.01, 64)
    window = monitor.close(2, busy=0.5, extra={})
    rows = {name: value for _, rank, name, value in window.rows if rank == -1}
    want = math.sqrt(0.3 ** 2 + 3 * 0.1 ** 2) / math.sqrt(25 + 3)
    assert rows["update_ratio"] == pytest.approx(want)
    assert rows["samples_per_s"] == pytest.approx((32 + 64) / 0.5)  # a growing batch counts
    assert rows["loss"] == pytest.approx(2.0)


def test_no_update_ratio_without_a_measured_step() -> None:
    monitor = _monitor(1)
    monitor.step(torch.tensor(1.0), torch.tensor(0.5), 0.01, 8)
    window = monitor.close(1, busy=0.1, extra={})
    assert "update_ratio" not in {name for _, _, name, _ in window.rows}


def test_a_per_rank_figure_is_recorded_per_rank_and_its_mean_for_the_job() -> None:
    monitor = _monitor(1)
    monitor.step(torch.tensor(1.0), torch.tensor(0.5), 0.01, 8)
    window = monitor.close(1, busy=0.1, extra={"pp/bubble": [0.1, 0.4], "lr": 0.5})
    got = {(rank, name): value for _, rank, name, value in window.rows
           if name in ("pp/bubble", "lr")}
    assert got == {(-1, "pp/bubble"): pytest.approx(0.25), (0, "pp/bubble"): 0.1,
                   (1, "pp/bubble"): 0.4, (-1, "lr"): 0.5}


def test_gpu_utilisation_from_nvml_and_nothing_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem.monitor import system

    assert system.gpu_utilisation(torch.device("cpu")) == {}
    monkeypatch.setattr(torch.cuda, "utilization", lambda device: 73)
    monkeypatch.setattr(torch.cuda, "memory_usage", lambda device: 12)
    assert system.gpu_utilisation(torch.device("cuda", 0)) == {
        "sys/gpu_util_percent": 73.0, "sys/gpu_mem_util_percent": 12.0}

    def no_nvml(device: torch.device) -> int:
        raise ModuleNotFoundError("pynvml does not seem to be installed")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    assert system.gpu_utilisation(torch.device("cuda", 0)) == {}
