"""Near misses (`tune.explore`): what a session whose diagnosis proposes nothing tries, and
that trying them does not make a well-configured job adopt anything (simulated runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tandem.tune import explore, smells
from tandem.tune.measure import Measured
from tests.unit.test_tune_session import _session

GIB = 2.0 ** 30
BASE = {"train.global_batch": 128, "precision.mode": "fp32", "data.workers": 0,
        "plan.bucket_mb": 25.0, "train.eval_every": 50}


def _job(**over: object) -> Measured:
    """A well-configured 2-process CPU job: 100 ms steps, 2 ms of data wait, 4 buckets
    of 1 ms latency, an evaluation of 400 ms every 50 steps."""
    figures: dict[str, Any] = {
        "threads": 1, "step_s": 0.1, "data_s": 0.002, "compute_s": 0.08, "comm_s": 0.01,
        "latency_s": 0.001, "bandwidth": 1e9, "grad_bytes": 100e6, "buckets": 4,
        "rss_bytes": 0.5 * GIB, "available_bytes": 8 * GIB, "eval_s": 0.4, **over}
    return Measured(world=2, cpus=2, config=dict(BASE),
                    summary={"micro_batch": 64, "accumulation": 1}, **figures)



def test_a_job_without_smells_gets_its_priced_neighbours_largest_first() -> None:
    m = _job()
    assert smells.smells(m) == []
    got = explore.near_misses(m, BASE)
    assert len(got) == explore.NEAR_MISSES
    # eval: 0.4 / 50 / 2 = 4 ms saved of a 108-ms wall step (1.038x); buckets: 4 -> 1
    # all-reduce, 3 ms of 100 ms (1.031x); the loader's 2 ms of 100 ms (1.020x) is left
    assert [c.changes for c in got] == [{"train.eval_every": 100}, {"plan.bucket_mb": 100.0}]
    assert got[0].predicted == pytest.approx(0.108 / 0.104)
    assert got[1].predicted == pytest.approx(0.1 / 0.097)
    assert all("near miss" in c.reason and not c.lossy for c in got)


def test_nothing_to_price_gives_no_near_miss() -> None:
    m = _job(data_s=None, buckets=1, eval_s=None)
    assert explore.near_misses(m, BASE) == []
    assert explore.near_misses(_job(step_s=None), BASE) == []


@pytest.mark.parametrize("seed", range(3))
def test_a_well_configured_session_tries_its_near_misses_and_adopts_nothing(
        tmp_path: Path, seed: int) -> None:
    # The simulated job has no smell; its runs show a data wait (1% of the step)
    tuner, runner = _session(tmp_path, {}, [], seed=seed, noise=0.08)
    tried = [r for r in tuner.records if r.kind == "candidate" and r.status != "not-reached"]
    assert [r.changes for r in tried] == [{"data.workers": 1}]
    assert any(ch == {"data.workers": 1} for _, ch in runner.launched)
    assert tuner.incumbent == {} and not [r for r in tuner.records if r.status == "adopted"]


def test_a_near_miss_that_is_really_faster_is_adopted(tmp_path: Path) -> None:
    tuner, _ = _session(tmp_path, {("data.workers", 1): 1.5}, [])
    assert tuner.incumbent == {"data.workers": 1}
