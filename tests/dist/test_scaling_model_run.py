"""The scaling model reads a real 2-process run and reproduces what it measured."""

from __future__ import annotations

from pathlib import Path

import pytest

import tandem
from tandem.analyze.scaling.inputs import run_figures
from tandem.analyze.scaling.model import predict
from tandem.parallel.hooks import ring_allreduce_bytes
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL = 20, 40


def _train(rank: int, world: int, out: str) -> None:
    cfg = toy_task.config(out, STEPS, GLOBAL, monitor={"calibrate_at": 4, "log_every": 4})
    cfg.run.name = "scaled"
    tandem.fit(toy_task.task(), config=cfg)


@pytest.mark.timeout(90)
def test_model_fits_a_real_run_and_predicts_other_sizes(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), timeout=80)
    fig = run_figures(tmp_path / "tandem.db", "scaled")
    grads = sum(p.numel() * 4 for p in toy_task.make_model().parameters())
    assert (fig.world_size, fig.global_batch, fig.micro_batch) == (2, GLOBAL, GLOBAL // 2)
    assert fig.bytes_per_step == pytest.approx(ring_allreduce_bytes(grads, 2))
    assert fig.latency_s is not None and fig.latency_s > 0
    assert fig.allreduce_bytes_per_s is not None and fig.allreduce_bytes_per_s > 0
    assert len(fig.host_cpu) == len(fig.process_cpu) >= 3
    got = predict(fig, [1, 2, 4, 8])
    # At its own size the model gives back the run's own medians.
    assert got[2].wire_s == pytest.approx(fig.comm_exposed_s, rel=1e-6)
    assert got[2].step_s == pytest.approx(max(fig.step_s, fig.step_s - fig.other_s
                                              + got[2].other_s), rel=1e-6)
    # Against the run's own throughput (the median window's samples over its wall time,
    # a figure the model does not read): within the model's 15% target. Not 5%: on this
    # toy run of ~1 ms steps, batch / (median step time) and the median window rate
    # differ by up to 10% from run to run (the median of a rate is not the rate of the
    # median step, and a window's wall time holds its close); 5% failed 2 runs in 8.
    assert got[2].samples_per_s == pytest.approx(fig.samples_per_s, rel=0.15)
    assert got[1].wire_s == 0.0 and got[1].wait_s == 0.0
    # More ranks on 2 cores: each gets less of a core, and the ring more hops.
    assert got[8].cpu_share < got[4].cpu_share <= got[2].cpu_share <= 1.0
    assert got[8].wire_s > got[4].wire_s > got[2].wire_s
    for p in got.values():
        assert 0 < p.low <= p.samples_per_s <= p.high
