"""plan.flush_denormal: the run's thread computes subnormal floats as zero, and only while
the run lasts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tandem.config.schema import PlanConfig
from tandem.runtime import flush_denormals, start, stop

SUBNORMAL = 1e-39  # below float32's smallest normal number, 1.18e-38


def halved() -> float:
    """A subnormal float32 halved, as this thread computes it."""
    return float(torch.tensor([SUBNORMAL], dtype=torch.float32).mul(0.5)[0])


@pytest.fixture(autouse=True)
def ieee_after() -> Iterator[None]:
    yield
    flush_denormals(False)  # whatever a failing test left, the next one starts from torch's


def test_start_flushes_and_stop_restores() -> None:
    exact = float(torch.tensor([SUBNORMAL], dtype=torch.float32)[0]) / 2  # in float64
    assert exact > 0 and halved() == pytest.approx(exact, rel=1e-6)  # torch's default: IEEE
    runtime = start(PlanConfig(device="cpu"))
    if not runtime.flushes_denormals:
        pytest.skip("this CPU cannot flush subnormals (torch.set_flush_denormal refused)")
    try:
        assert halved() == 0.0
    finally:
        stop(runtime)
    assert halved() == pytest.approx(exact, rel=1e-6)


def test_off_keeps_ieee_subnormals() -> None:
    runtime = start(PlanConfig(device="cpu", flush_denormal=False))
    try:
        assert not runtime.flushes_denormals
        assert halved() > 0.0
    finally:
        stop(runtime)
