"""The tune session's logic (candidate order, interleaved placebo, sequential decisions,
never-reached candidates, budget) on a simulated job: no processes.

`SimRunner` is a TrialRunner whose runs are written to a real run store by this test
instead of by `tandem run`: each run's throughput is the plan's true rate (the product of
the true gains of its changes) times seeded log-normal noise, and its windows close on a
simulated clock that the Tuner's budget reads. The tuner reads them back through the real
store, measurement, diagnosis and statistics.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from tandem.monitor.catalogue import LOSS, SAMPLES_PER_S, TIME_COMPUTE, TIME_DATA, TIME_STEP
from tandem.monitor.store import RunStore
from tandem.status import RunStatus
from tandem.tune.session import Settings, Tuner
from tandem.tune.space import Candidate
from tandem.tune.trial import RunOutcome, TrialRunner

BATCH = 64
BASE_RATE = 1000.0  # samples/s of the job as configured
START_S = 3.0  # simulated seconds a run takes before its first window


class SimRunner(TrialRunner):
    """Trial runs simulated into the run store (see the module docstring)."""

    def __init__(self, root: Path, gains: Mapping[tuple[str, Any], float], noise: float,
                 seed: int, job: Mapping[str, Any] | None = None) -> None:
        super().__init__("sim.py", [], 2, root / "work", root / "runs.db")
        self.gains, self.noise = dict(gains), noise
        self.rng = random.Random(seed)
        self.now = 0.0
        self.job = {"train.global_batch": BATCH, "precision.mode": "fp32",
                    "data.workers": 0, **(job or {})}
        self.launched: list[tuple[str, dict[str, Any]]] = []
        self.slowdown = 1.0
        self.env = {"ONEDNN_MAX_CPU_ISA": "AVX2"}  # no fast half kernels, on any host

    def resolve(self, timeout_s: float = 120.0) -> dict[str, Any]:
        return dict(self.job)

    def rate(self, changes: Mapping[str, Any]) -> float:
        """The plan's true samples/s."""
        return BASE_RATE * math.prod(self.gains.get((k, v), 1.0) for k, v in changes.items())

    def run(self, name: str, changes: Mapping[str, Any], steps: int, log_every: int,
            control: str = "", eval_every: int | None = None,
            watch: Callable[[], bool] | None = None) -> RunOutcome:
        self.runs += 1
        self.launched.append((name, dict(changes)))
        config: dict[str, dict[str, Any]] = {}
        for key, value in {**self.job, **changes}.items():
            section, _, field = key.partition(".")
            config.setdefault(section, {})[field] = value
        started = self.now
        timeout, capped = self.limit(started)  # the real runner's timeout, on this clock
        rate = self.rate(changes) * math.exp(self.rng.gauss(0.0, self.noise))
        rate /= self.slowdown if self.runs > 1 else 1.0  # a neighbour's load after the probe
        per_step = BATCH / rate
        self.now += START_S
        with RunStore(self.store_path) as store:
            store.start_run(name, name, config, dict(changes), {}, kind="trial")
        stopped = False
        for end in range(log_every, steps + 1, log_every):
            if self.now + per_step * log_every > started + timeout:  # killed there
                self.now = started + timeout
                out = self.read(name)
                out.ok, out.error = False, f"timed out after {timeout:.0f} s (killed)"
                out.wall_s, out.budget_cut = timeout, capped
                return out
            self.now += per_step * log_every
            with RunStore(self.store_path) as store:
                store.log_metrics(name, [
                    (end, -1, SAMPLES_PER_S, rate, self.now),
                    (end, -1, TIME_STEP, per_step, self.now),
                    (end, -1, TIME_DATA, 0.01 * per_step, self.now),
                    (end, -1, TIME_COMPUTE, 0.95 * per_step, self.now),
                    (end, -1, LOSS, 2.0 / (1 + end), self.now)])
            if watch is not None and watch():
                stopped = True
                break
        per_rank = BATCH // self.nproc
        micro = int({**self.job, **changes}.get("train.micro_batch") or per_rank)
        with RunStore(self.store_path) as store:
            store.finish_run(name, RunStatus.COMPLETED,
                             {"micro_batch": micro, "accumulation": per_rank // micro,
                              "startup_s": START_S})
        out = self.read(name)
        out.wall_s, out.stopped = self.now - started, stopped
        return out


def _cand(key: str, value: Any, predicted: float | None) -> Candidate:
    return Candidate({key: value}, "sim", f"{key} {value}", predicted=predicted)


def _session(tmp_path: Path, gains: Mapping[tuple[str, Any], float],
             extra: list[Candidate], seed: int = 0, noise: float = 0.03,
             job: Mapping[str, Any] | None = None,
             **settings: Any) -> tuple[Tuner, SimRunner]:
    runner = SimRunner(tmp_path / f"s{seed}", gains, noise, seed, job)
    tuner = Tuner(runner, Settings(**{"budget_s": 300.0, **settings}), f"tune-sim-{seed}",
                  extra, echo=lambda text: None, clock=lambda: runner.now)
    tuner.run()
    return tuner, runner


def _by_label(tuner: Tuner) -> dict[str, str]:
    return {r.label: r.status for r in tuner.records}


def test_the_largest_predicted_gain_is_tried_first_and_decided_in_one_or_two_pairs(
        tmp_path: Path) -> None:
    # Two smells on the job: fp16 on a CPU without half kernels (predicted from the
    # compute share: about 7x) and micro-batch 2 with accumulation 16 (sqrt(16) = 4x).
    # Only the first is real (5x).
    job = {"precision.mode": "fp16", "train.micro_batch": 2}
    tuner, runner = _session(tmp_path, {("precision.mode", "fp32"): 5.0}, [], job=job)
    tried = [r for r in tuner.records if r.kind == "candidate"]
    predicted = [r.figures["predicted"] for r in tried]
    assert tried[0].changes == {"precision.mode": "fp32"}
    assert predicted[0] == pytest.approx(1 / (1 - 0.95 * 0.9), rel=0.05)
    assert tuner.incumbent.get("precision.mode") == "fp32"
    # decided within two pairs: at most four runs launched under the fp32 plan before
    # the next candidate
    fix_runs = [ch for _, ch in runner.launched if ch == {"precision.mode": "fp32"}]
    assert len(fix_runs) <= 4
    startup = tuner._summary()["startup"]  # every paired run's start-up (A0's counted once)
    pairs = sum(len(a.pairs) for a in tuner.bench.arms)
    assert startup["runs"] == 2 * pairs and startup["total_s"] == START_S * 2 * pairs
    assert tried[0].status == "adopted"
    assert tried[0].figures["measured"] == pytest.approx(5.0, rel=0.15)


def test_the_users_own_candidates_come_first_in_their_order(tmp_path: Path) -> None:
    extra = [_cand("x.small", 1, 1.2), _cand("x.big", 1, 4.0), _cand("x.none", 1, None)]
    tuner, _ = _session(tmp_path, {("x.big", 1): 5.0}, extra)
    tried = [r.changes for r in tuner.records if r.kind == "candidate"]
    assert tried == [{"x.small": 1}, {"x.big": 1}, {"x.none": 1}]
    assert tuner.incumbent == {"x.big": 1}


def test_placebo_pairs_are_interleaved_with_a_candidates_pairs(tmp_path: Path) -> None:
    # A 4% effect under 3% noise is not decided in one pair: more pairs, and between
    # them the placebo's further pairs, up to --placebo-pairs.
    tuner, runner = _session(tmp_path, {("x.small", 1): 1.04}, [_cand("x.small", 1, 1.5)],
                             placebo_pairs=4, max_pairs=6)
    tags = [name.rsplit("-", 1)[1] for name, _ in runner.launched]
    first, last = tags.index("candidate"), len(tags) - 1 - tags[::-1].index("candidate")
    # PLACEBO_FIRST (2) pairs before any candidate run (A0 stands for the first one's
    # reference); the other two come between the candidate's runs
    assert tags[:first].count("placebo") == 2
    assert tags[first:last].count("placebo") == 2
    placebo = tuner.bench.placebo
    assert placebo is not None and len(placebo.pairs) == 4
    cand = next(a for a in tuner.bench.arms if a.label == "x.small=1")
    assert len(cand.pairs) >= 3
    kinds = [r.kind for r in tuner.records]
    assert kinds.count("placebo") == 3  # recorded when measured first, then per pair


@pytest.mark.parametrize("seed", range(6))
def test_a_well_configured_job_adopts_nothing(tmp_path: Path, seed: int) -> None:
    # Candidates that predict a gain but change nothing: noise 8% (a loaded machine).
    extra = [_cand("x.a", 1, 2.0), _cand("x.b", 1, 1.5), _cand("x.c", 1, 1.3)]
    tuner, _ = _session(tmp_path, {}, extra, seed=seed, noise=0.08)
    assert tuner.incumbent == {}
    assert not [r for r in tuner.records if r.status == "adopted"]


def test_max_trials_leaves_the_rest_recorded_as_never_reached(tmp_path: Path) -> None:
    extra = [_cand("x.a", 1, 3.0), _cand("x.b", 1, 2.0), _cand("x.c", 1, 1.2)]
    tuner, runner = _session(tmp_path, {}, extra, max_trials=1)
    status = _by_label(tuner)
    assert status["x.a=1"] != "not-reached"
    assert status["x.b=1"] == status["x.c=1"] == "not-reached"
    assert {c.label for c in tuner.unreached} == {"x.b=1", "x.c=1"}
    unreached = [r for r in tuner.records if r.status == "not-reached"]
    assert all("--max-trials reached" in r.decision for r in unreached)
    assert not any("x.b" in ch or "x.c" in ch for _, ch in runner.launched)


def test_the_budget_bounds_the_session_and_names_what_it_never_reached(
        tmp_path: Path) -> None:
    # Runs of about 4 + 3 simulated seconds; 60 s holds baseline, placebo and a few pairs.
    extra = [_cand(f"x.k{i}", 1, 2.0 - i / 10) for i in range(8)]
    tuner, runner = _session(tmp_path, {}, extra, budget_s=60.0, run_s=4.0)
    assert runner.now <= 60.0 * 1.1  # a run may end a little after the estimate
    unreached = [r for r in tuner.records if r.status == "not-reached"]
    assert unreached and all("no budget left" in r.decision for r in unreached)
    tried = [r.label for r in tuner.records if r.kind == "candidate"
             and r.status != "not-reached"]
    # those tried are the largest predictions, in order
    assert tried == [f"x.k{i}=1" for i in range(len(tried))]


def test_every_run_lasts_its_run_seconds_after_a_10x_adoption(tmp_path: Path) -> None:
    # The placebo measures the original plan; after a 10x faster plan is adopted its
    # further pairs must run at the original plan's own pace, and the adopted plan's
    # runs at its own (no longer stretched by its prediction): each run lasts about
    # run_s, never ten or four times that.
    tuner, runner = _session(tmp_path, {("x.fix", 1): 10.0}, [_cand("x.fix", 1, 8.0)],
                             placebo_pairs=6, run_s=5.0)
    assert tuner.incumbent == {"x.fix": 1}
    placebo = tuner.bench.placebo
    assert placebo is not None
    fix_arm = next(a for a in tuner.bench.arms if a.label == "x.fix=1")
    after = [p for p in placebo.pairs if p.arm.name > fix_arm.pairs[-1].arm.name]
    assert after, "no placebo pair after the adoption"
    runs = [r for a in tuner.bench.arms for p in a.pairs for r in (p.arm, p.reference)
            if r is not tuner.a0]
    for run in runs:
        # the first window of each size is a partial one: at most a window more (1/6)
        assert run.wall_s - START_S <= 5.0 * (1 + 1 / 6) * 1.3, (run.name, run.wall_s)


def test_a_run_the_budget_cannot_finish_is_cut_there_and_its_candidate_never_reached(
        tmp_path: Path) -> None:
    # The first candidate is 50 times slower than predicted: its runs would last far
    # longer than the 300-s trial timeout. Its timeout is capped by the budget left, so
    # the session ends on time, and the candidate is recorded as never reached (the
    # budget ran out), not as a failed change; the next one was never reached either.
    extra = [_cand("x.slow", 1, 2.0), _cand("x.next", 1, 1.5)]
    tuner, runner = _session(tmp_path, {("x.slow", 1): 0.02}, extra, budget_s=200.0,
                             run_s=5.0)
    assert runner.deadline == pytest.approx(200.0)
    assert runner.now <= 200.0 + 1e-6  # without the cap: a 300-s timeout past the budget
    status = _by_label(tuner)
    assert status["x.slow=1"] == status["x.next=1"] == "not-reached"
    slow = next(r for r in tuner.records if r.label == "x.slow=1")
    assert "budget ran out during its pair" in slow.decision and "timed out" in slow.decision
    assert {c.label for c in tuner.unreached} == {"x.slow=1", "x.next=1"}
    assert tuner.incumbent == {}


def test_the_last_candidate_takes_the_pairs_the_budget_left_affords(tmp_path: Path) -> None:
    # A 1.06x effect under 4% noise is not decided in --max-pairs 4 pairs; the only
    # candidate may use what the budget leaves (up to MAX_LAST_PAIRS), where a candidate
    # with another behind it stops at 4.
    from tandem.tune.runsize import MAX_LAST_PAIRS

    alone, _ = _session(tmp_path / "a", {("x.small", 1): 1.06}, [_cand("x.small", 1, 1.5)],
                        noise=0.04, max_pairs=4, budget_s=600.0, run_s=4.0)
    first, _ = _session(tmp_path / "b", {("x.small", 1): 1.06},
                        [_cand("x.small", 1, 1.5), _cand("x.other", 1, 1.2)],
                        noise=0.04, max_pairs=4, budget_s=600.0, run_s=4.0)
    pairs = {t: len(next(a for a in t.bench.arms if a.label == "x.small=1").pairs)
             for t in (alone, first)}
    assert pairs[first] <= 4
    assert 4 < pairs[alone] <= MAX_LAST_PAIRS


def test_runs_follow_the_machine_when_it_slows_down_after_the_probe(tmp_path: Path) -> None:
    # After the probe every run is 5 times slower: the first run sized from the probe's
    # pace lasts about 5 x run_s; each later one is sized from the run before it.
    runner = SimRunner(tmp_path, {}, 0.03, 0)
    runner.slowdown = 5.0
    tuner = Tuner(runner, Settings(budget_s=300.0, run_s=5.0), "tune-sim-slow",
                  [_cand("x.a", 1, 1.2)], echo=lambda text: None, clock=lambda: runner.now)
    tuner.run()
    runs = sorted({id(r): r for a in tuner.bench.arms for p in a.pairs
                   for r in (p.arm, p.reference) if r is not tuner.a0}.values(),
                  key=lambda r: r.name)
    long = [r.name for r in runs if r.wall_s - START_S > 5.0 * 2]
    assert len(runs) >= 4 and len(long) <= 1, long
