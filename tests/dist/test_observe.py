"""`python -m tandem.observe`: an unmodified DDP script, observed under torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.nn.parallel import DistributedDataParallel

from tandem.monitor.store import RunStore
from tandem.observe import StepObserver, leading_dim, observe_every
from tests.reap import kill_tree

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "dist" / "scripts" / "plain_ddp.py"
BATCH = 32

FAILING = """
import sys
import torch

print("argv", sys.argv[1:], "name", __name__)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(int(sys.argv[2])):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
raise RuntimeError("boom after the loop")
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                "TANDEM_STORE", "TANDEM_OBSERVE_EVERY"):
        env.pop(key, None)
    env.update(extra)
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str],
         timeout: float) -> subprocess.CompletedProcess:
    """Run `cmd` in its own session; on timeout kill the whole session (torchrun's
    workers too, which a plain kill of the launcher would leave behind)."""
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            out, err = proc.communicate()
            pytest.fail(f"{cmd} did not finish within {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _by_rank(store: RunStore, run_id: str, name: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for m in store.metrics(run_id, name=name):
        out.setdefault(m["rank"], {})[m["step"]] = m["value"]
    return out


@pytest.mark.timeout(150)
def test_plain_ddp_script_observed_under_torchrun(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "tandem.observe", str(SCRIPT), "--steps", "50", "--batch", str(BATCH),
           "--slow-rank", "1", "--slow-ms", "20"]
    proc = _run(cmd, tmp_path, _env(), timeout=120)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    assert "done: 50 steps" in proc.stdout  # the script got its own argv

    with RunStore(tmp_path / "runs" / "tandem.db") as store:
        run = store.run("plain_ddp-observed")
        assert run["status"] == "completed"
        assert run["plan"] == {"mode": "observe", "world_size": 2}
        assert run["env"]["world_size"] == 2
        assert run["summary"]["steps"] == 50 and run["summary"]["samples_per_s"] > 0
        rid = run["run_id"]
        step_time = _by_rank(store, rid, "time/step")
        # Windows close at 20 and 40 on both ranks (gathered); the last 10 steps come
        # after the script destroyed its group: rank 0 flushes them alone.
        assert sorted(step_time[0]) == [20, 40, 50] and sorted(step_time[1]) == [20, 40]
        assert sorted(step_time[-1]) == [20, 40, 50]
        scores = _by_rank(store, rid, "straggler/score")
        assert sorted(scores[0]) == sorted(scores[1]) == [20, 40]
        for step in (20, 40):  # rank 1 waits 20 ms for each batch: the straggler
            assert scores[1][step] > 1.3 > 1.0 > scores[0][step], scores
        rates = _by_rank(store, rid, "samples_per_s")[-1]
        for step, rate in rates.items():
            # world x batch samples per step: the batch was learned from DDP's
            # forward, and the no_grad evaluation pass did not count.
            assert rate * step_time[-1][step] == pytest.approx(2 * BATCH, rel=1e-6)
        rss = _by_rank(store, rid, "mem/rss_bytes")
        assert all(v > 0 for r in (0, 1) for v in rss[r].values())


@pytest.mark.timeout(60)
def test_failing_script_without_process_group(tmp_path: Path) -> None:
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    db = tmp_path / "elsewhere" / "store.db"
    proc = _run([sys.executable, "-m", "tandem.observe", str(script), "--steps", "25"],
                tmp_path, _env(TANDEM_STORE=str(db), TANDEM_OBSERVE_EVERY="10"), timeout=50)
    assert proc.returncode != 0 and "boom after the loop" in proc.stderr
    assert "argv ['--steps', '25'] name __main__" in proc.stdout
    with RunStore(db) as store:
        run = store.run("failing-observed")
        assert run["status"] == "failed"
        assert run["summary"]["steps"] == 25 and run["summary"]["samples_per_s"] is None
        step_time = _by_rank(store, run["run_id"], "time/step")
        assert sorted(step_time[0]) == sorted(step_time[-1]) == [10, 20, 25]
        assert "samples_per_s" not in store.metric_names(run["run_id"])  # no DDP forward


@pytest.mark.timeout(10)
def test_settings_and_batch_size() -> None:
    assert observe_every({}) == 20
    assert observe_every({"TANDEM_OBSERVE_EVERY": "5"}) == 5
    for bad in ("0", "-3", "ten"):
        with pytest.raises(ValueError, match=f"TANDEM_OBSERVE_EVERY={bad!r}: must be a pos"):
            observe_every({"TANDEM_OBSERVE_EVERY": bad})
    import torch

    x = torch.zeros(7, 3)
    assert leading_dim((x,), {}) == 7
    assert leading_dim((torch.tensor(1.0), [x]), {}) == 7
    assert leading_dim((), {"batch": {"ids": x}}) == 7
    assert leading_dim(("text",), {}) == 0


@pytest.mark.timeout(10)
def test_derive_scores_time_outside_backward() -> None:
    observer = StepObserver(every=10, rank=0, world_size=3, recorder=None)
    # steps, seconds, backward, forward, samples, rss, cuda_peak, cuda_total, timed:
    # equal step times (DDP waits for the slowest), rank 2 spends 3x longer outside.
    table = [[10, 1.0, 0.8, 0.1, 80, 1e9, 0, 0, 1],
             [10, 1.0, 0.8, 0.1, 80, 1e9, 0, 0, 1],
             [10, 1.0, 0.4, 0.3, 80, 1e9, 0, 0, 1]]
    window = observer.derive(10, table, [0, 1, 2])
    rows = {(rank, name): value for _, rank, name, value in window.rows}
    assert rows[(2, "straggler/score")] == pytest.approx(3.0)
    assert rows[(0, "straggler/score")] == pytest.approx(1.0)
    assert rows[(-1, "samples_per_s")] == pytest.approx(240.0) == window.samples_per_s
    assert rows[(-1, "time/step")] == pytest.approx(0.1)
    local = observer.derive(20, [table[0]], [0])  # the group is gone: rank 0 alone
    names = {(rank, name) for _, rank, name, _ in local.rows}
    assert (0, "straggler/score") not in names and (0, "time/step") in names
    assert local.samples_per_s == pytest.approx(240.0)  # equal batches assumed


@pytest.mark.timeout(10)
def test_install_and_uninstall_restore_ddp_forward() -> None:
    original = DistributedDataParallel.forward
    observer = StepObserver(every=10, rank=0, world_size=1, recorder=None)
    observer.install()
    try:
        assert DistributedDataParallel.forward is not original
    finally:
        observer.uninstall()
        observer.uninstall()
    assert DistributedDataParallel.forward is original
