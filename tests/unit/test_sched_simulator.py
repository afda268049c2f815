"""The simulator on a tiny synthetic trace (JCTs by hand) and on one shipped workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.cli import main
from tandem.sched import Cluster, FIFOPolicy, JobSpec, TiresiasPolicy, simulate
from tandem.sched.simulation.traces import TraceApplication
from tandem.sched.simulation.workload import default_traces_dir


def _toy_traces(root: Path) -> TraceApplication:
    """One application: 0.5 s per step at any micro-batch on 1 or 2 processes of one node.

    The gradient has no noise (grad_var 0), so every step advances progress by exactly 1
    whatever the batch; two epochs of 60 steps each make 120 steps = 60 s of training.
    """
    app = root / "toy"
    app.mkdir()
    (app / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n"
        "1,4,0.5,0.0\n1,8,0.5,0.0\n2,4,0.5,0.1\n2,8,0.5,0.1\n")
    (app / "scalability.csv").write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
    (app / "validation-8.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n60,60,0.5,1.0,0.0\n120,120,0.9,1.0,0.0\n")
    return TraceApplication(app)


def test_fifo_jcts_by_hand(tmp_path: Path) -> None:
    apps = {"toy": _toy_traces(tmp_path)}
    specs = [JobSpec(job_id=name, submit_time=t, min_procs=2, max_procs=2, batch_size=8,
                     application="toy") for name, t in (("a", 0.0), ("b", 10.0))]
    result = simulate(specs, apps, FIFOPolicy(), Cluster(nodes=1, slots_per_node=2),
                      interval=60.0, restart_delay=30.0)
    # a: placed at t=0, 30 s restart delay, 60 s training -> done at 90.
    # b: waits for the tick after a ends (t=120), 30 + 60 s -> done at 210.
    assert result.jcts == pytest.approx({"a": 90.0, "b": 200.0})
    assert result.mean_jct == pytest.approx(145.0)
    assert result.makespan == pytest.approx(210.0)
    assert result.restarts == 0 and result.resizes == 0 and result.preemptions == 0


def test_restart_delay_per_application_by_hand(tmp_path: Path) -> None:
    toy = _toy_traces(tmp_path)
    apps = {"toy": toy, "slow-start": toy}
    specs = [JobSpec(job_id="a", submit_time=0.0, min_procs=2, max_procs=2, batch_size=8,
                     application="slow-start"),
             JobSpec(job_id="b", submit_time=10.0, min_procs=2, max_procs=2, batch_size=8,
                     application="toy")]
    result = simulate(specs, apps, FIFOPolicy(), Cluster(nodes=1, slots_per_node=2),
                      interval=60.0, restart_delay=30.0, restart_delays={"slow-start": 90.0})
    # a: 90 s start-up + 60 s training -> done at 150; b: placed at the tick t=180,
    # 30 + 60 s -> done at 270.
    assert result.jcts == pytest.approx({"a": 150.0, "b": 260.0})
    with pytest.raises(ValueError, match=r"restart_delays\['toy'\]: -1.0 is not allowed"):
        simulate(specs, apps, FIFOPolicy(), Cluster(nodes=1, slots_per_node=2),
                 restart_delays={"toy": -1.0})


def test_preemption_costs_a_restart_by_hand(tmp_path: Path) -> None:
    apps = {"toy": _toy_traces(tmp_path)}
    # Each job needs 30 s of restart delay and 60 s of training; 100 process-seconds
    # demote a job (one 60 s interval on 2 processes is 120).
    specs = [JobSpec(job_id="long", submit_time=0.0, min_procs=2, max_procs=2, batch_size=8,
                     application="toy"),
             JobSpec(job_id="short", submit_time=50.0, min_procs=2, max_procs=2,
                     batch_size=8, application="toy")]
    result = simulate(specs, apps, TiresiasPolicy(thresholds=(100.0,)),
                      Cluster(nodes=1, slots_per_node=2), interval=60.0, restart_delay=30.0)
    # t=0: long starts (0-30 delay, 30-60 trains 30 s: half done, 120 process-s: demoted).
    # t=60: short (queue 0) preempts long; 60-90 delay, 90-120 trains half.
    # t=120: both demoted, FIFO in queue 1: long resumes, 120-150 delay, done at 180.
    # t=180: short resumes, 180-210 delay, done at 240.
    assert result.jcts == pytest.approx({"long": 180.0, "short": 190.0})
    assert result.restarts == 2 and result.preemptions == 2 and result.resizes == 0


def test_cli_tiresias_on_a_shipped_workload_matches_the_published_average(capsys) -> None:
    traces = default_traces_dir()
    published = json.loads((traces / "results-jobload/tiresias-1.0/summary.json").read_text())
    assert main(["scheduler", "simulate", "--policy", "tiresias", "--workload",
                 "workload-6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["jcts"]) == 160
    assert out["mean_jct"] == pytest.approx(published["avgs"]["workload-6"], rel=0.05)
    assert out["published_mean_jct"] == published["avgs"]["workload-6"]


def test_trace_lookup_reads_measured_rows_and_interpolates_between() -> None:
    traces = default_traces_dir()
    app = TraceApplication(traces / "traces" / "cifar10")
    rows = [line.split(",") for line in
            (traces / "traces/cifar10/placements.csv").read_text().splitlines()[1:]]
    measured = {(r[0], float(r[1])): (float(r[2]), float(r[3])) for r in rows}
    assert app.step_sync((1, 2), 64.0) == measured["12", 64.0]
    assert app.step_sync((2, 1), 64.0) == measured["12", 64.0]  # same placement, rotated
    low, high = measured["12", 45.0], measured["12", 64.0]
    mid = app.step_sync((1, 2), 54.5)
    assert mid[0] == pytest.approx((low[0] + high[0]) / 2)
    # five nodes were never measured: between the 4-node and 6-node figures at 10 GPUs
    five = app.step_sync((2, 2, 2, 2, 2), 128.0)
    four = app._at_nodes(4, 10, 128.0)
    six = app._at_nodes(6, 10, 128.0)
    assert min(four[0], six[0]) <= five[0] <= max(four[0], six[0])


def test_goodput_beats_tiresias_on_a_shipped_workload() -> None:
    from tandem.sched.service.command import run_workload

    traces = default_traces_dir()
    published = {name: json.loads((traces / f"results-jobload/{name}-1.0/summary.json")
                                  .read_text())["avgs"]["workload-3"]
                 for name in ("pollux", "tiresias")}
    goodput, _ = run_workload("goodput", "workload-3")
    assert len(goodput.jcts) == 160
    assert goodput.mean_jct < 0.75 * published["tiresias"]
    assert goodput.mean_jct == pytest.approx(published["pollux"], rel=0.10)
