"""The scaling model on synthetic runs, against predictions worked out by hand."""

from __future__ import annotations

import math
import platform
from pathlib import Path

import pytest

from tandem.analyze.scaling.comm import (
    CPU_LINK,
    CUDA_LINK,
    JITTER_PER_WORK,
    JITTER_SCHEDULED,
    SHM_LINK,
    cpu_share,
    expected_order,
    saturation,
    wait_units,
)
from tandem.analyze.scaling.inputs import figures_from_run, run_figures, steady_steps
from tandem.analyze.scaling.model import (
    COLD_START_S,
    SHM_COLD_START_S,
    WAKE_CREDIT_S,
    RunFigures,
    background_threads,
    batch_split,
    predict,
)
from tandem.monitor.store import RunStore

A, BETA, WAKE, GAMMA, FIXED = (CPU_LINK[k] for k in (
    "hop_latency_s", "link_bytes_per_s", "wake_s", "local_bytes_per_s", "step_wake_s"))
GRAD = 1_000_000.0  # gradient bytes


def expected_max(n: int) -> float:
    """E[max] of n independent standard normals (0 for n = 1)."""
    return expected_order(n, n) if n > 1 else 0.0


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
    # Past ~1000 ranks the count of orderings overflows a float unless taken as a log.
    assert expected_max(1000) == pytest.approx(3.241436, rel=1e-5)
    assert expected_max(1000) < expected_max(2048) < 3.5
    # Other order statistics: the smallest of two, the median of three, the third of four
    # (tabulated: 0.297011); the four of them average to zero.
    assert expected_order(1, 2) == pytest.approx(-1 / math.sqrt(math.pi), rel=1e-5)
    assert expected_order(2, 3) == pytest.approx(0.0, abs=1e-9)
    assert expected_order(3, 4) == pytest.approx(0.297011, rel=1e-5)
    assert sum(expected_order(i, 4) for i in range(1, 5)) == pytest.approx(0.0, abs=1e-9)


def test_saturation_and_share_by_hand() -> None:
    assert cpu_share(2, 2, 0.0) == 1.0 and cpu_share(4, 2, 0.0) == 0.5
    assert cpu_share(1, 2, 3.0) == 0.5
    assert saturation(2, 2, 0.0) == 0.0 and saturation(3, 2, 0.0) == 0.5
    assert saturation(4, 2, 0.0) == 1.0 and saturation(1, 2, 9.0) == 1.0


# The order statistics of four standard normals (tables), and the 4-on-2-cores wait: the
# ranks arrive at the collective spread by one core-second of work; until the first one
# arrives all four run at half a core, then the three left at 2/3, then two and one at
# a whole core each.
E4 = (-1.029375, -0.297011, 0.297011, 1.029375)
ARRIVALS4 = [E4[0] / 0.5]
for _k, _share in ((1, 2 / 3), (2, 1.0), (3, 1.0)):
    ARRIVALS4.append(ARRIVALS4[-1] + (E4[_k] - E4[_k - 1]) / _share)
COST4 = ARRIVALS4[-1]  # the step ends when the last arrives
MEAN_WAIT4 = ARRIVALS4[-1] - sum(ARRIVALS4) / 4  # what each rank measures waiting


def test_wait_units_by_hand() -> None:
    # With a core each, the step waits for the last: E[max] both ways.
    assert wait_units(2, 2, 0.0) == pytest.approx((expected_max(2), expected_max(2)))
    assert wait_units(4, 8, 2.0) == pytest.approx((expected_max(4), expected_max(4)))
    # Sharing cores, a rank that arrived gives its share to the ones still working: the
    # step pays far less than the ranks measure waiting.
    assert COST4 == pytest.approx(0.366182, rel=1e-4)
    assert wait_units(4, 2, 0.0) == pytest.approx((COST4, MEAN_WAIT4), rel=1e-5)
    assert wait_units(4, 2, 0.0)[0] < expected_max(4) < wait_units(4, 2, 0.0)[1]


def test_idle_machine_from_one_process() -> None:
    fig = one_process()
    assert background_threads(fig) == (0.0, 0.0, 0.0)  # 2 x 0.5 busy = our one core
    got = predict(fig, [1, 2, 4])
    assert got[1].step_s == pytest.approx(0.112)
    # Two ranks: one core each, half the samples each, the ring over 2 hops and the
    # step's fixed sleep (the bytes' work at a whole core), no foreign thread to wake past
    # and no cold start.
    wire2 = FIXED + 2 * A + (1.0 * GRAD / BETA + GRAD / GAMMA)
    pre2 = 0.050 + 0.002 + 0.002
    wait2 = JITTER_PER_WORK * pre2 * expected_max(2)
    p2 = got[2]
    assert p2.cpu_share == 1.0
    assert (p2.compute_s, p2.data_s, p2.optim_s, p2.other_s) == pytest.approx(
        (0.050, 0.002, 0.006, 0.002))
    assert p2.wire_s == pytest.approx(wire2)
    assert p2.wait_s == pytest.approx(wait2)
    assert p2.samples_per_s == pytest.approx(128 / (pre2 + 0.006 + wire2 + wait2))
    # Four ranks on two cores: all of a rank's work, the cold start (in its compute) and
    # the bytes' work included, at half a core; the hops sleep as they did. The ranks'
    # arrival spread costs COST4 per core-second of it.
    p4 = got[4]
    assert p4.cpu_share == 0.5
    assert (p4.compute_s, p4.data_s, p4.optim_s, p4.other_s) == pytest.approx(
        ((0.100 / 4 + COLD_START_S) / 0.5, 0.001 / 0.5, 0.006 / 0.5, 0.002 / 0.5))
    assert p4.wire_s == pytest.approx(FIXED + 6 * A + (1.5 * GRAD / BETA + GRAD / GAMMA) / 0.5)
    sigma4 = (JITTER_PER_WORK + JITTER_SCHEDULED) * (0.025 + COLD_START_S + 0.001 + 0.002)
    assert p4.wait_s == pytest.approx(sigma4 * COST4, rel=1e-4)
    for p in got.values():
        assert p.low <= p.samples_per_s <= p.high
        assert p.step_s == pytest.approx(sum(p.breakdown.values()))


def test_saturated_machine_shares_cores_with_foreign_threads() -> None:
    # The host is fully busy and the run's process got 0.4 of a core: the host's other
    # 1.6 cores went to foreign threads at 0.4 each, 4 of them.
    fig = one_process(host_cpu=(1.0,) * 3, process_cpu=(0.4,) * 3)
    assert background_threads(fig) == pytest.approx((4.0, 4.0, 4.0))
    # The run worked 0.4 x 112 ms = 44.8 core-ms: forward, backward and data 0.4 x 104 ms,
    # the rest 3.2 ms. That rest is where a shared core's cold start is paid, but the
    # prior (6 ms) does not fit in it: the run paid 3.2 / 6 of it, and so will other sizes.
    seen = 0.4 * 0.008 / COLD_START_S
    p2 = predict(fig, [2])[2]
    share = 2 / (2 + 4)
    assert p2.cpu_share == pytest.approx(share)
    # At 2 ranks: half the samples, the cold start again (scaled alike), the bytes' work;
    # the first 5 ms after the all-reduce ahead of the foreign threads (a whole core: the
    # two ranks have one each), the rest at a third of a core, the bytes last.
    compute = 0.4 * 0.100 / 2 + seen * COLD_START_S
    bytes2 = GRAD / BETA + GRAD / GAMMA
    work = compute + 0.4 * 0.004 / 2 + bytes2
    wall = WAKE_CREDIT_S + (work - WAKE_CREDIT_S) / share
    assert p2.compute_s + p2.data_s + p2.optim_s + p2.other_s + p2.wire_s == pytest.approx(
        wall + FIXED + 2 * A + WAKE * 4 / 2)
    assert p2.wire_s == pytest.approx(bytes2 / share + FIXED + 2 * A + WAKE * 4 / 2)
    assert p2.compute_s == pytest.approx(compute * (wall - bytes2 / share) / (work - bytes2))
    assert p2.optim_s == 0.0 and p2.other_s == 0.0  # the cold start took the whole rest
    # The arrival spread: the first rank to arrive gives its third of a core to the
    # foreign threads and the last rank (one of five threads now) gets 0.4.
    sigma = (JITTER_PER_WORK + JITTER_SCHEDULED) * (compute + 0.4 * 0.004 / 2)
    last = -expected_max(2) / share + 2 * expected_max(2) / 0.4
    assert p2.wait_s == pytest.approx(sigma * last, rel=1e-5)
    # On a dedicated machine the same work runs on a whole core each, without the cold
    # start of a shared core.
    alone = predict(fig, [1, 2], background=0.0)
    assert alone[1].compute_s == pytest.approx(0.4 * 0.100)
    assert alone[2].compute_s == pytest.approx(0.4 * 0.100 / 2)


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
    empty = one_process(step_s=0.0, compute_s=0.0, backward_s=0.0, data_s=0.0, optim_s=0.0)
    with pytest.raises(ValueError, match="no measured step time"):
        predict(empty, [1])


def two_process(**changes: object) -> RunFigures:
    """A 2-process run on the idle 2-core machine, a core each: 30 ms steps of 20 ms
    compute, 1 ms data, 4 ms optimizer, 4 ms exposed all-reduce and 1 ms sync wait, with
    a calibrated link (0.4 ms latency, 1e9 B/s)."""
    values: dict = dict(
        world_size=2, global_batch=128, micro_batch=64, cores=2, step_s=0.030,
        compute_s=0.020, data_s=0.001, optim_s=0.004, comm_exposed_s=0.004,
        sync_wait_s=0.001, grad_bytes=GRAD, bytes_per_step=GRAD, buckets_per_step=1.0,
        latency_s=0.0004, allreduce_bytes_per_s=1e9, samples_per_s=128 / 0.030,
        host_cpu=(0.9,) * 5, process_cpu=(0.9,) * 5)
    values.update(changes)
    return RunFigures(**values)


def test_two_processes_on_their_own_cores() -> None:
    fig = two_process()
    assert background_threads(fig)[0] == pytest.approx(0.0)  # 2 x 0.9 = the host's 1.8
    got = predict(fig, [1, 2, 4])
    # The exposed all-reduce held the bytes' work (GRAD / 1e9 sent, GRAD / GAMMA copied:
    # 1.5 ms); the other 2.5 ms the ranks slept: the step's fixed sleep, the rest over
    # 2 hops.
    bytes2 = GRAD / 1e9 + GRAD / GAMMA
    hop = (0.004 - bytes2 - FIXED) / 2
    assert got[2].step_s == pytest.approx(0.030)
    assert got[2].wire_s == pytest.approx(0.004) and got[2].wait_s == pytest.approx(0.001)
    # One process: twice the samples, no collective.
    assert got[1].step_s == pytest.approx(0.040 + 0.002 + 0.004)
    assert got[1].wire_s == 0.0 and got[1].wait_s == 0.0
    # Four processes on two cores: half a core each for all the work, the cold start and
    # 3/2 of the bytes sent included; 6 hops asleep; the arrival spread's work part
    # (fitted: 1 ms at 2 ranks) and the scheduler's prior share of the same work, at
    # COST4 per unit.
    work4 = 0.010 + COLD_START_S + 0.0005 + 0.004 + 1.5 * GRAD / 1e9 + GRAD / GAMMA
    per_work = JITTER_PER_WORK * 0.001 / (JITTER_PER_WORK * 0.021 * expected_max(2))
    sigma4 = (per_work + JITTER_SCHEDULED) * (0.010 + COLD_START_S + 0.0005)
    p4 = got[4]
    assert p4.compute_s == pytest.approx((0.010 + COLD_START_S) / 0.5)
    assert p4.wire_s == pytest.approx((1.5 * GRAD / 1e9 + GRAD / GAMMA) / 0.5 + FIXED
                                      + 6 * hop)
    assert p4.wait_s == pytest.approx(sigma4 * COST4, rel=1e-4)
    assert p4.step_s == pytest.approx(work4 / 0.5 + FIXED + 6 * hop + sigma4 * COST4,
                                      rel=1e-4)


def test_four_processes_on_two_cores_from_their_cpu_time() -> None:
    # Like MNIST-1D's CNN at 4 processes on 2 idle cores: 40 ms steps, 16 ms compute,
    # 11 ms optimizer (its own collective inside), 11.5 ms exposed all-reduce, 1.5 ms
    # sync wait; each process used 0.43 of a core, the host 0.86 (nothing foreign).
    fig = RunFigures(
        world_size=4, global_batch=128, micro_batch=32, cores=2, step_s=0.040,
        compute_s=0.016, optim_s=0.011, comm_exposed_s=0.0115, sync_wait_s=0.0015,
        grad_bytes=GRAD, bytes_per_step=1.5 * GRAD, buckets_per_step=1.0,
        samples_per_s=128 / 0.040, host_cpu=(0.86,) * 5, process_cpu=(0.43,) * 5)
    assert background_threads(fig)[0] == pytest.approx(0.0)
    # A rank worked 0.43 x 40 = 17.2 core-ms a step; at half a core that is 34.4 ms of
    # the 40: the cores idled 5.6 ms (the ranks slept in the collectives), not the
    # 13 ms of exposed all-reduce and wait the phases show.
    asleep = 0.040 - 0.0172 / 0.5
    # While a rank computed, the others slept 1.5 of their 16 ms in the wait: 3.72
    # runnable threads on 2 cores. The rest of the work is per step: the cold start, the
    # bytes' work (prior link) and 0.7 ms of optimizer.
    per_sample = 0.016 * 2 / (4 - 3 * 0.0015 / 0.016)
    bytes4 = 1.5 * GRAD / BETA + GRAD / GAMMA
    optim = 0.0172 - per_sample - COLD_START_S - bytes4
    assert optim == pytest.approx(0.000698, abs=1e-6)
    # The wait: the scheduler's prior share of the work before the collective (the per-
    # sample work and the cold start) explains part of the 1.5 ms measured; the rest is
    # the work's own spread, which stays at other sizes.
    before = per_sample + COLD_START_S
    scheduled = JITTER_SCHEDULED * before * MEAN_WAIT4
    assert scheduled < 0.0015
    per_work = (0.0015 - scheduled) / (before * MEAN_WAIT4)
    cost = 0.0015 * COST4 / MEAN_WAIT4
    hop = (asleep - cost - FIXED) / 6
    got = predict(fig, [1, 2, 4])
    assert got[4].step_s == pytest.approx(0.040)
    # One process: the four ranks' samples on one core, no cold start, no collective.
    assert got[1].step_s == pytest.approx(4 * per_sample + optim, rel=1e-4)
    # Two: a core each, the hops at the fitted latency, the work's spread over twice the
    # samples (the scheduler's part needs a saturated host).
    bytes2 = GRAD / BETA + GRAD / GAMMA
    wait2 = per_work * 2 * per_sample * expected_max(2)
    assert got[2].wait_s == pytest.approx(wait2, rel=1e-4)
    assert got[2].step_s == pytest.approx(
        2 * per_sample + optim + bytes2 + FIXED + 2 * hop + wait2, rel=1e-4)


def test_foreign_threads_beside_a_multi_process_run() -> None:
    # Two ranks beside about four foreign threads (host saturated, a third of a core per
    # rank): the run's own size comes back, and a dedicated machine runs it faster.
    fig = two_process(step_s=0.104, compute_s=0.060, data_s=0.002, optim_s=0.008,
                      comm_exposed_s=0.030, sync_wait_s=0.004, latency_s=0.001,
                      samples_per_s=128 / 0.104, host_cpu=(1.0,) * 5,
                      process_cpu=(0.33,) * 5)
    share = 0.33 / (1 - 0.004 / 0.104)  # while runnable: all but the wait
    foreign = (2 - 2 * 0.33) / share
    assert background_threads(fig)[0] == pytest.approx(foreign)
    got = predict(fig, [1, 2, 4])
    assert got[2].step_s == pytest.approx(0.104)
    # The measured wait (4 ms, each rank's mean) costs the step less: the rank that
    # arrived first sleeps and the other one, beside the foreign threads alone, runs at
    # min(1, 2 / (1 + foreign)) instead of 2 / (2 + foreign). The rest of the 4 ms is in
    # the phases (the mean rank ran that much faster), so the exposed all-reduce comes
    # back as the run measured it.
    first = -expected_max(2) / (2 / (2 + foreign))
    last = first + 2 * expected_max(2) / min(1.0, 2 / (1 + foreign))
    assert got[2].wait_s == pytest.approx(0.004 * last / ((last - first) / 2))
    assert got[2].wire_s == pytest.approx(0.030)
    alone = predict(fig, [1, 2, 4], background=0.0)
    for n in (1, 2, 4):
        assert alone[n].samples_per_s > got[n].samples_per_s
    assert got[1].wire_s == 0.0 and got[1].wait_s == 0.0


def test_exposure_below_the_bytes_means_a_faster_link() -> None:
    fig = two_process(step_s=0.104, compute_s=0.060, data_s=0.002, optim_s=0.008,
                      comm_exposed_s=0.001, sync_wait_s=0.004)
    got = predict(fig, [2, 4])
    # The calibrated link's bytes (1.5 ms) cannot have taken more than the 1 ms
    # exposed: their work is 2/3 of the model's, and nothing was left to sleep.
    assert got[2].wire_s == pytest.approx(0.001)
    assert got[4].wire_s == pytest.approx((1.5 * GRAD / 1e9 + GRAD / GAMMA) * 2 / 3 / 0.5)


def test_cuda_ranks_share_devices_and_their_bytes_are_wire_time() -> None:
    # 2 ranks on 2 GPUs: 50 ms steps of 40 ms compute, 1 ms data, 5 ms optimizer, 3 ms
    # exposed all-reduce and 1 ms wait; NCCL calibrated at 0.2 ms latency and 10 GB/s.
    fig = RunFigures(
        world_size=2, global_batch=128, micro_batch=64, device="cuda", cores=8,
        devices=2, step_s=0.050, compute_s=0.040, data_s=0.001, optim_s=0.005,
        comm_exposed_s=0.003, sync_wait_s=0.001, grad_bytes=GRAD, bytes_per_step=GRAD,
        buckets_per_step=1.0, latency_s=0.0002, allreduce_bytes_per_s=1e10,
        samples_per_s=128 / 0.050, host_cpu=(0.3,) * 5, process_cpu=(0.9,) * 5)
    # The bytes cross the device link (wire time, no host work, no cold start): the
    # exposed 3 ms is the bytes and the hops, the rest of it spread over the 2 hops.
    wire2 = GRAD / 1e10 + GRAD / CUDA_LINK["local_bytes_per_s"]
    hop = 0.0001 + (0.003 - 2 * 0.0001 - wire2) / 2
    got = predict(fig, [1, 2, 4])
    assert got[2].step_s == pytest.approx(0.050)
    assert got[1].step_s == pytest.approx(0.080 + 0.002 + 0.005)
    # Four ranks on two devices: half a device each; 6 hops and 3/2 of the bytes.
    p4 = got[4]
    assert p4.cpu_share == 0.5
    assert (p4.compute_s, p4.data_s, p4.optim_s) == pytest.approx((0.040, 0.001, 0.010))
    wire4 = 1.5 * GRAD / 1e10 + GRAD / CUDA_LINK["local_bytes_per_s"]
    assert p4.wire_s == pytest.approx(6 * hop + wire4)
    per_work = 0.001 / (0.041 * expected_max(2))
    sigma4 = (per_work + JITTER_SCHEDULED) * 0.0205
    assert p4.wait_s == pytest.approx(sigma4 * COST4, rel=1e-4)


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


def test_a_run_that_slept_less_than_the_fixed_sleep() -> None:
    # The exposed all-reduce held the bytes' work and 0.2 ms of sleep, less than the
    # prior's fixed sleep: that 0.2 ms is the step's fixed sleep, and no hop is left.
    bytes2 = GRAD / 1e9 + GRAD / GAMMA
    assert 0.0002 < FIXED
    fig = two_process(comm_exposed_s=bytes2 + 0.0002, step_s=0.026 + bytes2 + 0.0002)
    got = predict(fig, [2, 4])
    assert got[2].step_s == pytest.approx(fig.step_s)
    assert got[4].wire_s == pytest.approx((1.5 * GRAD / 1e9 + GRAD / GAMMA) / 0.5 + 0.0002)


def test_one_process_buckets_hide_behind_a_short_backward_but_not_the_fixed_sleep() -> None:
    # Four buckets of a 1 MB gradient; backward lasts 0.4 ms, so of the three earlier
    # buckets' sleep at 2 ranks (3 x 2 hops) only 0.3 ms hides behind it. The step's
    # fixed sleep comes after the last bucket and hides behind nothing.
    fig = one_process(bucket_bytes=250_000.0, backward_s=0.0004)
    hops = 4 * 2 * A
    exposure = 1.0 - 0.0004 * 3 / 4 / hops
    p2 = predict(fig, [2], background=0.0)[2]
    assert p2.wire_s == pytest.approx(GRAD / BETA + GRAD / GAMMA + FIXED + exposure * hops)


def test_shared_memory_priors_replace_gloos_at_two_processes() -> None:
    """A one-process run whose plan would all-reduce through shared memory predicts two
    ranks with that path's priors: its hops and bytes, and no fixed sleep."""
    hop, rate, local = (SHM_LINK[k] for k in (
        "hop_latency_s", "link_bytes_per_s", "local_bytes_per_s"))
    gloo, shm = (predict(one_process(shared_memory=flag), [2])[2] for flag in (False, True))
    assert shm.wire_s == pytest.approx(2 * hop + (1.0 * GRAD / rate + GRAD / local))
    assert gloo.wire_s == pytest.approx(FIXED + 2 * A + (1.0 * GRAD / BETA + GRAD / GAMMA))
    assert shm.samples_per_s > gloo.samples_per_s
    # Four ranks on two cores: each rank's cold start is the shared-memory path's.
    gloo4, shm4 = (predict(one_process(shared_memory=flag), [4])[4] for flag in (False, True))
    assert gloo4.compute_s == pytest.approx((0.100 / 4 + COLD_START_S) / 0.5)
    assert shm4.compute_s == pytest.approx((0.100 / 4 + SHM_COLD_START_S) / 0.5)


@pytest.mark.parametrize(("plan", "settings", "expected"), [
    ({"strategy": "ddp", "allreduce": "shared_memory"}, {}, True),
    ({"strategy": "ddp", "allreduce": "backend"}, {"host_allreduce": "auto"}, False),
    ({"strategy": "single"}, {"host_allreduce": "auto", "comm_hook": "none"}, True),
    ({"strategy": "single"}, {"host_allreduce": "backend"}, False),
    ({"strategy": "single"}, {"host_allreduce": "auto", "comm_hook": "fp16"}, False),
    ({"strategy": "single"}, {}, False),  # a run made before the option: gloo
])
def test_a_stored_run_says_which_all_reduce_it_took(tmp_path: Path, plan: dict,
                                                    settings: dict, expected: bool) -> None:
    if expected and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the shared-memory path is x86-64 only")
    run = {"run_id": "r", "config": {"plan": settings, "train": {"global_batch": 8}},
           "plan": {"device": "cpu", "micro_batch": 8, **plan}, "env": {"world_size": 1}}
    rows = [{"step": s, "rank": -1, "name": "time/step", "value": 0.01, "time": 0.0}
            for s in (10, 20, 30)]
    assert figures_from_run(run, rows, cores=2).shared_memory is expected
