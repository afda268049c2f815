"""Calibration leaves no trace in a comm hook with memory; bytes/step without calibration."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tandem
from tandem.monitor.store import RunStore
from tandem.parallel.hooks import ring_allreduce_bytes
from tests.dist import toy_task
from tests.dist.procs import run_ranks

STEPS, GLOBAL = 8, 40


def _train(rank: int, world: int, out: str) -> None:
    for hook in ("powersgd", "topk"):
        for calibrate_at in (0, 3):
            name = f"{hook}-{calibrate_at}"
            cfg = toy_task.config(out, STEPS, GLOBAL,
                                  plan={"comm_hook": hook, "powersgd_rank": 1,
                                        "powersgd_warmup": 2, "topk_ratio": 0.1},
                                  monitor={"calibrate_at": calibrate_at, "log_every": 4})
            cfg.run.name = name
            result = tandem.fit(toy_task.task(), config=cfg)
            if rank == 0:
                torch.save(result.model.state_dict(), Path(out, f"{name}.pt"))
    cfg = toy_task.config(out, 4, GLOBAL, monitor={"calibrate_at": 0, "log_every": 4})
    cfg.run.name = "plain"
    tandem.fit(toy_task.task(), config=cfg)


@pytest.mark.timeout(150)
def test_calibration_does_not_change_what_a_stateful_hook_trains(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), timeout=140)
    for hook in ("powersgd", "topk"):
        without = torch.load(tmp_path / f"{hook}-0.pt", weights_only=True)
        calibrated = torch.load(tmp_path / f"{hook}-3.pt", weights_only=True)
        for name, value in without.items():
            torch.testing.assert_close(calibrated[name], value, rtol=0, atol=0, msg=name)
    # DDP's own all-reduce reports its bytes without any calibration.
    grads = sum(p.numel() * 4 for p in toy_task.make_model().parameters())
    with RunStore(tmp_path / "tandem.db") as store:
        rows = store.metrics(store.run("plain")["run_id"], "comm/bytes_per_step")
        plain = store.run("plain")["summary"]
        calibrated = store.run("topk-3")
        cost = store.metrics(calibrated["run_id"], "time/calibration_s")
    assert rows and rows[-1]["value"] == pytest.approx(ring_allreduce_bytes(grads, 2))
    # What calibration cost is recorded, within the run's time; nothing without it.
    assert plain["calibration_s"] == 0.0
    spent = calibrated["summary"]["calibration_s"]
    assert 0 < spent < calibrated["summary"]["wall_time_s"]
    assert cost and cost[-1]["value"] == pytest.approx(spent, rel=0.5)
