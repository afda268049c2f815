"""Measurements read back from a run store: per-size throughput, views, resize records."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tandem.monitor.store import RunStore
from tandem.sched import Cluster, GoodputPolicy
from tandem.sched.service.lifecycle import complete_record
from tandem.sched.service.measured import attempt_rates, read, throughput_model
from tandem.sched.service.records import Attempt, JobRecord
from tandem.sched.service.views import JobState, choose_batch

T0 = 1_000_000.0


def _store(tmp: Path, noise: float | None = None, steps: int | None = None) -> RunStore:
    store = RunStore(tmp / "tandem.db")
    train = {"global_batch": 64} if steps is None else {"global_batch": 64, "steps": steps}
    store.start_run("job-r", "job-j1", {"train": train}, {}, {})
    rows = []
    # attempt 1 (1 process, t 0..100): 100, 110, 112, 108 samples/s; attempt 2 (2
    # processes, t 120..): 190, 210, 200. The first window of each is start-up.
    for i, rate in enumerate([100, 110, 112, 108]):
        rows.append((10 * (i + 1), -1, "samples_per_s", rate, T0 + 20 + 20 * i))
    for i, rate in enumerate([150, 210, 200]):
        rows.append((50 + 10 * i, -1, "samples_per_s", rate, T0 + 140 + 10 * i))
    if noise is not None:
        rows += [(60, -1, "grad_noise_scale", noise, T0 + 160)]
    store.log_metrics("job-r", rows)
    store.log_events("job-r", [(40, -1, "preempted", "stop", None, None, T0 + 99),
                               (40, -1, "resume", "resumed", None, None, T0 + 135)])
    return store


def _attempts() -> list[Attempt]:
    return [Attempt(job_id="j1", attempt=1, backend="local", procs=1, launched=T0,
                    ended=T0 + 100, stop_requested=T0 + 95),
            Attempt(job_id="j1", attempt=2, backend="local", procs=2, launched=T0 + 120)]


def test_windows_go_to_the_attempt_that_ran_them(tmp_path: Path) -> None:
    with _store(tmp_path) as store:
        measured = read(store, "job-j1")
    rates = attempt_rates(measured, _attempts(), 64)
    assert rates == {(1, 64): 110.0, (2, 64): 205.0}  # medians without each first window
    model = throughput_model(rates, slots_per_node=4)
    assert model is not None
    assert model.samples_per_s(1, 1, 64) == pytest.approx(110.0, rel=1e-6)
    assert model.samples_per_s(1, 2, 32) == pytest.approx(205.0, rel=1e-6)


def test_view_and_batch_choice(tmp_path: Path) -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    record = JobRecord(job_id="j1", name="job", script="t.py", cwd=".", min_procs=1,
                       max_procs=4, adaptive_batch=True, run_name="job-j1", state="running",
                       procs=2, submitted=T0 - 10)
    with _store(tmp_path) as store:
        plain = JobState(record=record, attempts=_attempts(), measured=read(store, "job-j1"))
    view = plain.view(T0 - 100, T0 + 200, cluster)
    assert view.placement == (0, 0) and view.spec.submit_time == pytest.approx(90.0)
    assert view.attained_service == pytest.approx(100 * 1 + 80 * 2)
    assert view.max_measured_procs == 2 and view.restarts == 1
    assert math.isinf(view.efficiency.noise_scale)
    # No noise scale measured: the batch never changes, whatever the job asked.
    assert not view.spec.adapt_batch and choose_batch(plain, view, 4, cluster) is None
    (tmp_path / "n").mkdir()
    with _store(tmp_path / "n", noise=1e6) as s:
        noisy = JobState(record=record, attempts=_attempts(), measured=read(s, "job-j1"))
    view = noisy.view(T0 - 100, T0 + 200, cluster)
    assert view.spec.adapt_batch and view.spec.limits.max_batch == 4 * 64
    batch = choose_batch(noisy, view, 4, cluster)
    # A huge noise scale makes a larger batch almost free of statistical cost.
    assert batch is not None and batch > 64 and batch % 4 == 0
    assert GoodputPolicy().allocate([view], cluster, 300.0)["j1"]


def test_progress_is_the_latest_step_over_the_steps_asked_for(tmp_path: Path) -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    record = JobRecord(job_id="j1", name="job", script="t.py", cwd=".", min_procs=1,
                       max_procs=4, run_name="job-j1", state="running", procs=2,
                       submitted=T0 - 10)
    with _store(tmp_path) as store:
        unknown = JobState(record=record, attempts=_attempts(), measured=read(store, "job-j1"))
    assert unknown.view(T0 - 100, T0 + 200, cluster).progress == 0.0
    assert unknown.view(T0 - 100, T0 + 200, cluster).remaining() is None
    (tmp_path / "s").mkdir()
    with _store(tmp_path / "s", steps=80) as store:
        known = JobState(record=record, attempts=_attempts(), measured=read(store, "job-j1"))
    view = known.view(T0 - 100, T0 + 200, cluster)
    assert view.progress == pytest.approx(70 / 80)  # the latest window is step 70
    # 260 process-seconds on 2 processes, 1/8 of the work left for 7/8 done
    assert view.remaining() == pytest.approx(260 / 2 * (10 / 80) / (70 / 80))


def test_a_run_counts_as_training_from_its_segment_event(tmp_path: Path) -> None:
    cluster = Cluster(nodes=1, slots_per_node=4)
    record = JobRecord(job_id="j1", name="job", script="t.py", cwd=".", min_procs=1,
                       max_procs=4, run_name="job-j1", state="running", procs=2,
                       submitted=T0 - 10)
    epoch = T0 - 100
    with _store(tmp_path) as store:
        windows_only = JobState(record=record, attempts=_attempts(),
                                measured=read(store, "job-j1"))
        # attempt 2 launched at T0 + 120, its first window at T0 + 140
        assert windows_only.view(epoch, T0 + 200, cluster).running_since == 240.0
        store.log_events("job-r", [(40, -1, "segment", "training", None, None, T0 + 126)])
        segment = JobState(record=record, attempts=_attempts(), measured=read(store, "job-j1"))
    assert segment.view(epoch, T0 + 200, cluster).running_since == 226.0


def test_resize_record_from_the_store(tmp_path: Path) -> None:
    row = {"job_id": "j1", "attempt": 1, "kind": "resize", "decided": T0 + 95,
           "from_procs": 1, "to_procs": 2, "from_batch": None, "to_batch": None}
    with _store(tmp_path) as store:
        measured = read(store, "job-j1")
    done = complete_record(row, _attempts(), measured, job_done=False)
    assert done["stopped"] == T0 + 100 and done["stopped_step"] == 40
    assert done["training_again"] == T0 + 135 and done["steps_redone"] == 0
    assert done["first_window"] == T0 + 140 and done["closed"] == 1
