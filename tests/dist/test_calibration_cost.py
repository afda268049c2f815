"""A measurement's cost to the run is the last-arriving rank's time, not an early rank's
wait for it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tandem.monitor.calibrate import link_cost
from tandem.trainer.calibration import added_to_run
from tests.dist.procs import run_ranks

SKEW = 0.4  # rank 1 reaches the measurement this much later than rank 0


def _measure(rank: int, world: int, out: str) -> None:
    dist.init_process_group("gloo")
    try:
        dist.barrier()
        if rank == 1:
            time.sleep(SKEW)  # a slower rank: its step ends later
        started = time.perf_counter()
        link_cost(64 * 1024, torch.device("cpu"))
        own = time.perf_counter() - started
        added = added_to_run(own, torch.device("cpu"))
        Path(out, f"{rank}.json").write_text(json.dumps({"own": own, "added": added}))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_the_cost_is_the_last_ranks_time_not_the_wait_for_it(tmp_path: Path) -> None:
    run_ranks(_measure, 2, str(tmp_path), timeout=50)
    early, late = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    # Rank 0 waited for rank 1 inside the probe: its own time holds the skew.
    assert early["own"] >= SKEW * 0.9
    # The late rank did not wait: its time lacks the skew (relative, not a bound in
    # seconds, which a slower host's probe alone could pass).
    assert early["own"] - late["own"] > SKEW / 2
    # Both ranks record the late rank's time, the probe's own cost.
    assert early["added"] == late["added"] == pytest.approx(late["own"])
