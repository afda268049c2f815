"""The scaling model on synthetic runs, against predictions worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tandem.analyze.scaling_comm import (
    CPU_LINK,
    JITTER_PER_WORK,
    JITTER_SCHEDULED_S,
    cpu_share,
    expected_max,
    saturation,
)
from tandem.analyze.scaling_inputs import figures_from_run, run_figures, steady_steps
from tandem.analyze.scaling_model import (
    COLD_START_S,
    WAKE_CREDIT_S,
    RunFigures,
    background_threads,
    batch_split,
    predict,
    throughput_points,
)
from tandem.monitor.store import RunStore

A, BETA, WAKE, GAMMA = (CPU_LINK[k] for k in ("hop_latency_s", "link_bytes_per_s",
                                              "wake_s", "local_bytes_per_s"))
GRAD = 1_000_000.0  # gradient bytes


def one_process(**changes: object) -> RunFigures:
    """A one-process run on an otherwise idle 2-core machine: 100 ms of compute for 128
    samples, 4 ms data, 6 ms optimizer, 2 ms outside every phase."""
    values: dict = dict(world_size=1, global_batch=128, micro_batch=128, cores=2,
                        step_s=0.112, compute_s=0.100, backward_s=0.06, data_s=0.004,
                        optim_s=0.006, samples_per_s=128 / 0.112, grad_bytes=GRAD,
                        host_cpu=(0.5, 0.5, 0.5), process_cpu=(1.0, 1.0, 1.0))
    values.update(changes)
    return RunFigures(**values)


def test_expected_maximum_of_normals_matches_known_values() -> None:
    assert expected_max(1) == 0.0
    assert expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-5)
    assert expected_max(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-5)
    assert expected_max(4) == pytest.approx(1.029375, rel=1e-5)


def test_saturation_and_share_by_hand() -> None:
    assert cpu_share(2, 2, 0.0) == 1.0 and cpu_share(4, 2, 0.0) == 0.5
    assert cpu_share(1, 2, 3.0) == 0.5
    assert saturation(2, 2, 0.0) == 0.0 and saturation(3, 2, 0.0) == 0.5
    assert saturation(4, 2, 0.0) == 1.0 and saturation(1, 2, 9.0) == 1.0


def test_idle_machine_from_one_process() -> None:
    fig = one_process()
    assert background_threads(fig) == (0.0, 0.0, 0.0)  # 2 x 0.5 busy = our one core
    got = predict(fig, [1, 2, 4])
    assert got[1].step_s == pytest.approx(0.112)
    # Two ranks: one core each, half the samples each, the ring over 2 hops, no foreign
    # thread to wake past and no cold start.
    wire2 = 2 * A + (1.0 * GRAD / BETA + GRAD / GAMMA)
    pre2 = 0.050 + 0.002 + 0.002
    wait2 = JITTER_PER_WORK * pre2 * expected_max(2)
    p2 = got[2]
    assert p2.cpu_share == 1.0
    assert (p2.compute_s, p2.data_s, p2.optim_s, p2.other_s) == pytest.approx(
        (0.050, 0.002, 0.006, 0.002))
    assert p2.wire_s == pytest.approx(wire2)
    assert p2.wait_s == pytest.approx(wait2)
    assert p2.samples_per_s == pytest.approx(128 / (pre2 + 0.006 + wire2 + wait2))
    # Four ranks on two cores: half a core each, and a cold start each step; the bytes'
    # work at half a core too. The optimizer runs first after the collective: its first
    # WAKE_CREDIT_S (5 ms of its 6) at full speed.
    assert WAKE_CREDIT_S == 0.005
    p4 = got[4]
    compute4 = (0.100 / 4 + COLD_START_S) / 0.5
    assert p4.cpu_share == 0.5
    assert (p4.compute_s, p4.data_s, p4.optim_s, p4.other_s) == pytest.approx(
        (compute4, 0.002, 0.005 + 0.001 / 0.5, 0.004))
    assert p4.wire_s == pytest.approx(6 * A + (1.5 * GRAD / BETA + GRAD / GAMMA) / 0.5)
    sigma4 = JITTER_PER_WORK * (compute4 + 0.006) + JITTER_SCHEDULED_S
    assert p4.wait_s == pytest.approx(sigma4 * expected_max(4))
    for p in got.values():
        assert p.low <= p.samples_per_s <= p.high
        assert p.step_s == pytest.approx(sum(p.breakdown.values()))


def test_saturated_machine_shares_cores_with_foreign_threads() -> None:
    # The host is fully busy and the run's process got 0.4 of a core: 2 / 0.4 = 5
    # runnable threads, 4 of them foreign.
    fig = one_process(host_cpu=(1.0,) * 3, process_cpu=(0.4,) * 3)
    assert background_threads(fig) == pytest.approx((4.0, 4.0, 4.0))
    p2 = predict(fig, [2])[2]
    share = 2 / (2 + 4)
    per_sample = (0.100 * 0.4 - COLD_START_S) / 128  # core-seconds, cold start apart
    assert p2.cpu_share == pytest.approx(share)
    # After the collective the rank runs 5 ms at full speed: the optimizer (2.4 ms of
    # core time), the loop (0.8), the data (0.8), then 1 ms of the compute.
    assert (p2.optim_s, p2.other_s, p2.data_s) == pytest.approx((0.0024, 0.0008, 0.0008))
    assert p2.compute_s == pytest.approx(
        0.001 + (per_sample * 64 + COLD_START_S - 0.001) / share)
    assert p2.wire_s == pytest.approx(2 * A + WAKE * 4 / 2
                                      + (GRAD / BETA + GRAD / GAMMA) / share)
    # On a dedicated machine the same work runs on a whole core each, without the cold
    # start of a shared core.
    alone = predict(fig, [1, 2], background=0.0)
    assert alone[1].compute_s == pytest.approx(per_sample * 128)
    assert alone[2].compute_s == pytest.approx(per_sample * 64)


def test_fixed_micro_batch_accumulates_and_bad_sizes_are_refused() -> None:
    fig = one_process(micro_batch=16, micro_batch_setting=16)
    assert batch_split(fig, 2) == (16, 4)
    assert batch_split(fig, 8) == (16, 1)
    with pytest.raises(ValueError, match="train.micro_batch 16"):
        batch_split(fig, 16)
    with pytest.raises(ValueError, match="train.global_batch 128"):
        predict(fig, [3])
    with pytest.raises(ValueError, match="background"):
        predict(fig, [2], background=-1.0)


def two_process() -> RunFigures:
    """A 2-process run beside 2 foreign threads (host saturated, 0.5 core per rank while
    runnable) with a calibrated link and 30 ms of exposed communication."""
    return RunFigures(
        world_size=2, global_batch=128, micro_batch=64, cores=2, step_s=0.104,
        compute_s=0.060, data_s=0.002, optim_s=0.008, comm_exposed_s=0.030,
        sync_wait_s=0.004, grad_bytes=GRAD, bytes_per_step=GRAD, buckets_per_step=1.0,
        latency_s=0.001, allreduce_bytes_per_s=1e9, samples_per_s=128 / 0.104,
        host_cpu=(1.0,) * 5, process_cpu=(0.33,) * 5)


def test_multi_process_run_fits_its_exposed_communication() -> None:
    fig = two_process()
    busy = 1 - 0.004 / 0.104  # all but the wait for the slower rank
    foreign = 2 / (0.33 / busy) - 2
    assert background_threads(fig)[0] == pytest.approx(foreign)
    got = predict(fig, [1, 2, 4])
    assert got[2].wire_s == pytest.approx(0.030)  # the fit reproduces the run
    assert got[2].wait_s == pytest.approx(0.004)
    assert got[2].step_s == pytest.approx(0.104)
    assert got[1].wire_s == 0.0 and got[1].wait_s == 0.0
    # By hand: the calibrated link gives the hop latency (1 ms over 2 hops) and the link
    # rate (1e9 B/s at 2(N-1)/N = 1); what the run exposed beyond that wire is shared
    # between the wake and the bucket copies in proportion to their priors, and each
    # part then follows its own law at 4 ranks.
    s2, s4 = cpu_share(2, 2, foreign), cpu_share(4, 2, foreign)
    wire = 2 * 0.0005 + GRAD / 1e9 / s2
    wake, local = WAKE * foreign / 2, GRAD / GAMMA / s2
    scale = (0.030 - wire) / (wake + local)
    expect4 = (6 * 0.0005 + WAKE * scale * foreign / 2
               + (1.5 * GRAD / 1e9 + GRAD * scale / GAMMA) / s4)
    assert got[4].wire_s == pytest.approx(expect4)
    per_sample = (0.060 * s2 - COLD_START_S) / 64
    compute4 = (per_sample * 32 + COLD_START_S) / s4
    assert got[4].compute_s == pytest.approx(compute4)
    # The optimizer's first 5 ms ran at full speed after the all-reduce, at 2 ranks and 4.
    assert got[4].optim_s == pytest.approx(0.005 + 0.003 * s2 / s4)
    prior2 = (JITTER_PER_WORK * 0.062 + JITTER_SCHEDULED_S) * expected_max(2)
    work4 = compute4 + got[4].data_s + got[4].other_s
    expect_wait = (0.004 / prior2 * (JITTER_PER_WORK * work4 + JITTER_SCHEDULED_S)
                   * expected_max(4))
    assert got[4].wait_s == pytest.approx(expect_wait)
    assert throughput_points(got) == [(n, got[n].samples_per_s) for n in (1, 2, 4)]


def test_exposure_below_the_wire_means_backward_hid_part_of_it() -> None:
    fig = RunFigures(**{**two_process().__dict__, "comm_exposed_s": 0.001,
                        "host_cpu": (0.9,) * 5, "process_cpu": (0.9,) * 5})
    got = predict(fig, [2, 4])
    assert got[2].wire_s == pytest.approx(0.001)
    assert got[4].wire_s > got[2].wire_s


def _store_run(path: Path, plan: dict | None = None) -> None:
    """A stored 1-process run: 6 windows of 10 steps, calibration after step 20."""
    with RunStore(path) as store:
        store.start_run("r1", "r1", {"train": {"global_batch": 64, "micro_batch": 0},
                                     "monitor": {"calibrate_at": 20, "log_every": 10}},
                        plan or {"strategy": "single", "micro_batch": 64, "device": "cpu"},
                        {"world_size": 1, "cpu_count": 2})
        rows = []
        for i, step in enumerate(range(10, 70, 10)):
            slow = 2.0 if step <= 20 else 1.0  # warm-up and the calibration window
            values = {"time/step": 0.05 * slow + 0.001 * i, "time/compute": 0.04 * slow,
                      "time/data": 0.001, "time/optim": 0.002, "samples_per_s": 1000.0,
                      "sys/cpu_percent": 100.0, "sys/process_cpu_percent": 50.0,
                      "mem/grad_bytes": 4096.0}
            rows += [(step, -1, k, v, 0.0) for k, v in values.items()]
        store.log_metrics("r1", rows)


def test_reading_a_stored_run(tmp_path: Path) -> None:
    _store_run(tmp_path / "tandem.db")
    fig = run_figures(tmp_path / "tandem.db", "r1")
    # Windows ending at 10 (warm-up) and 20 (holds step 20's calibration) are left out.
    assert fig.step_s == pytest.approx(0.05 + 0.001 * 3.5)
    assert fig.compute_s == pytest.approx(0.04)
    assert (fig.world_size, fig.global_batch, fig.micro_batch, fig.cores) == (1, 64, 64, 2)
    assert fig.host_cpu == (1.0,) * 4 and fig.process_cpu == (0.5,) * 4
    assert background_threads(fig)[0] == pytest.approx(3.0)
    with RunStore(tmp_path / "tandem.db") as store:
        groups_steps = steady_steps({"time/step": store.metrics("r1", "time/step")}, 20)
    assert groups_steps == [30, 40, 50, 60]


def test_plans_the_model_does_not_describe_are_refused(tmp_path: Path) -> None:
    _store_run(tmp_path / "tandem.db", plan={"strategy": "fsdp", "micro_batch": 64})
    with RunStore(tmp_path / "tandem.db") as store:
        run, metrics = store.run("r1"), store.metrics("r1")
    with pytest.raises(ValueError, match="plan.strategy 'fsdp'"):
        figures_from_run(run, metrics)
    with pytest.raises(ValueError, match="no run store"):
        run_figures(tmp_path / "missing.db", "r1")


def test_predicted_scaling_for_the_report(tmp_path: Path) -> None:
    from tandem.analyze.scaling import predicted_scaling

    _store_run(tmp_path / "tandem.db")
    got = predicted_scaling(tmp_path / "tandem.db", "r1", (1, 2, 3, 4))
    assert sorted(got["scaling_predicted"]) == ["1", "2", "4"]  # 64 samples: not on 3
    direct = predict(run_figures(tmp_path / "tandem.db", "r1"), [4])[4]
    assert got["scaling_predicted"]["4"]["samples_per_s"] == pytest.approx(
        direct.samples_per_s)
    _store_run(tmp_path / "fsdp.db", plan={"strategy": "fsdp", "micro_batch": 64})
    assert predicted_scaling(tmp_path / "fsdp.db", "r1") == {}
