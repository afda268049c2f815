"""Local SGD and DiLoCo: right by construction where that can be checked, and cheaper."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import tandem
from tandem.monitor.store import RunStore
from tests.dist import toy_task
from tests.dist.procs import run_ranks


def _sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.SGD(params, lr=0.05)


def _train(rank: int, world: int, out: str, strategy: str, every: int, steps: int) -> None:
    task = tandem.Task(model=toy_task.make_model, optimizer=_sgd,
                       train_data=toy_task.IndexedData, loss=toy_task.loss)
    cfg = toy_task.config(out, steps, 40, plan={"strategy": strategy, "sync_every": every},
                          monitor={"log_every": 4}, checkpoint={"every": 0, "at_end": True})
    result = tandem.fit(task, config=cfg)
    torch.save(result.model.state_dict(), Path(out, f"weights{rank}.pt"))


def _reference(steps: int) -> torch.nn.Module:
    torch.manual_seed(tandem.runtime.derive_seed("build", 7))
    data, model = toy_task.IndexedData(), toy_task.make_model()
    opt = _sgd(model.parameters())
    order = toy_task.reference(steps, 40)[1]
    for step in range(steps):
        ids = torch.tensor(order[step * 40:(step + 1) * 40])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
        opt.step()
    return model


@pytest.mark.timeout(120)
def test_local_sgd_meeting_every_step_is_data_parallel_sgd(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), "localsgd", 1, 12, timeout=100)
    ref = _reference(12).state_dict()
    for rank in range(2):
        got = torch.load(tmp_path / f"weights{rank}.pt", weights_only=True)
        for name, value in ref.items():
            torch.testing.assert_close(got[name], value, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.timeout(120)
def test_diloco_trains_in_step_replicas_with_fewer_bytes(tmp_path: Path) -> None:
    run_ranks(_train, 2, str(tmp_path), "diloco", 4, 24, timeout=100)
    w0, w1 = (torch.load(tmp_path / f"weights{r}.pt", weights_only=True) for r in range(2))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # replicas meet at the end
    with RunStore(tmp_path / "tandem.db") as store:
        run_id = store.runs()[-1]["run_id"]
        loss = [m["value"] for m in store.metrics(run_id, name="loss", rank=-1)]
        sent = [m["value"] for m in store.metrics(run_id, name="comm/bytes_per_step")]
    assert loss[-1] < loss[0]
    param_bytes = sum(p.numel() * 4 for p in toy_task.make_model().parameters())
    assert max(sent) == pytest.approx(param_bytes / 4, rel=0.01)  # 2(N-1)/N = 1, every 4th
