"""Paired arms and the session's noise, on a simulated machine with run-to-run noise.

Each simulated run's throughput is its plan's true rate x a slow drift x lognormal noise
(independent per run), the model the statistics assume; the tests count how often the
tuner's decision procedure (placebo first, then an arm judged pair by pair) adopts a
change that does nothing, and how often it adopts a real gain.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import pytest

from tandem.tune import stats
from tandem.tune.arms import PLACEBO, Arm, Bench, Pair
from tandem.tune.trial import RunOutcome


class Machine:
    """Runs whose figures are rate(plan) x drift x exp(N(0, sigma))."""

    def __init__(self, rates: Mapping[str, float], sigma: float, seed: int,
                 drift: float = 0.0) -> None:
        self.rates, self.sigma, self.drift = dict(rates), sigma, drift
        self.rng = random.Random(seed)
        self.launched: list[tuple[str, dict[str, Any]]] = []

    def launch(self, tag: str, changes: Mapping[str, Any], control: str) -> RunOutcome:
        self.launched.append((tag, dict(changes)))
        key = ",".join(f"{k}={v}" for k, v in sorted(changes.items()))
        rate = self.rates.get(key, self.rates[""])
        rate *= (1 + self.drift) ** len(self.launched)
        rate *= math.exp(self.rng.gauss(0, self.sigma))
        return RunOutcome(f"run{len(self.launched)}", ok=True,
                          summary={"wall": rate, "step": rate})


def _session(machine: Machine, changes: dict[str, Any], placebo_pairs: int = 3,
             max_pairs: int = 4) -> tuple[str, Bench, Arm]:
    bench = Bench(machine.launch, 0.05, figure_of=lambda run: run.summary)
    placebo = bench.add(Arm("placebo", PLACEBO, {}, {}))
    while len(placebo.pairs) < placebo_pairs:
        assert bench.pair(placebo) == ""
    arm = bench.add(Arm("cand", "candidate", changes, {}))
    verdict = "more"
    while verdict == "more":
        assert bench.pair(arm) == ""
        verdict = bench.judge(arm, stats.MIN_PAIRS, max_pairs)
    return verdict, bench, arm


def test_pairs_alternate_order_and_never_share_a_run() -> None:
    machine = Machine({"": 100.0, "x=1": 150.0}, 0.0, 1)
    bench = Bench(machine.launch, figure_of=lambda run: run.summary)
    arm = bench.add(Arm("x", "candidate", {"x": 1}, {}))
    for _ in range(4):
        bench.pair(arm)
    assert [p.arm_first for p in arm.pairs] == [False, True, False, True]
    assert [tag for tag, _ in machine.launched] == ["ref", "candidate", "candidate", "ref"] * 2
    names = [r.name for p in arm.pairs for r in (p.reference, p.arm)]
    assert len(set(names)) == len(names) == 8
    assert arm.logs() == pytest.approx([math.log(1.5)] * 4)


def test_a_change_that_does_nothing_is_not_adopted() -> None:
    """300 sessions on a machine whose two runs of one plan differ by ~+-15% (per-run sd
    10%): an arm that may spend the whole error rate adopts an equal plan in at most
    2.5% of them (the sequential rule's bound; min_gain keeps it lower still)."""
    wins = sum(_session(Machine({"": 100.0}, 0.10, seed), {"x": 1})[0] == "win"
               for seed in range(300))
    assert wins <= 0.025 * 300, wins


def _tuner_like(machine: Machine, candidates: list[dict[str, Any]]) -> list[str]:
    """A placebo of 3 pairs, then each candidate judged pair by pair with the share of
    the error rate the tuner gives its k-th candidate (2^-k); the ones that won."""
    bench = Bench(machine.launch, 0.05, figure_of=lambda run: run.summary)
    placebo = bench.add(Arm("placebo", PLACEBO, {}, {}))
    while len(placebo.pairs) < 3:
        assert bench.pair(placebo) == ""
    won = []
    for k, changes in enumerate(candidates, start=1):
        arm = bench.add(Arm(str(changes), "candidate", changes, {}, share=0.5 ** k))
        verdict = "more"
        while verdict == "more":
            assert bench.pair(arm) == ""
            verdict = bench.judge(arm, stats.MIN_PAIRS, 4)
        if verdict == "win":
            won.append(arm.label)
    return won


def test_a_session_of_equal_plans_adopts_one_in_at_most_2_5_percent() -> None:
    """Six candidates that change nothing per session, 200 sessions at per-run sd 15%
    (a loaded machine): the shares 2^-k bound the chance that a session adopts any of
    them by the error rate a single arm has at its first share, 2.5% x (1 - 2^-6): 5 of
    200 expected at most, 9 the binomial's 95th percentile there."""
    nulls = [{f"x{i}": 1} for i in range(6)]
    sessions = sum(bool(_tuner_like(Machine({"": 100.0}, 0.15, seed), nulls))
                   for seed in range(200))
    assert sessions <= 9, sessions


def test_a_large_gain_is_found_on_a_noisy_machine() -> None:
    """A 3.3x fix tried first on a machine whose runs differ by up to 2x (per-run sd
    30%): the arm's own interval over 1 + min_gain finds it in about 3 sessions of 4 (a
    floor at the placebo's upper bound, which counted the noise twice, in 41 of 100)."""
    wins = sum(_tuner_like(Machine({"": 100.0, "x=1": 330.0}, 0.30, seed),
                           [{"x": 1}]) == ["{'x': 1}"] for seed in range(100))
    assert wins >= 65, wins


def test_a_real_gain_is_adopted_and_its_interval_covers_it() -> None:
    results = [_session(Machine({"": 100.0, "x=1": 200.0}, 0.07, seed), {"x": 1})
               for seed in range(200)]
    wins = [r for r in results if r[0] == "win"]
    assert len(wins) >= 180, len(wins)
    covered = sum(bench.interval(arm).low <= 2.0 <= bench.interval(arm).high
                  for _, bench, arm in results)
    assert covered >= 0.9 * len(results)


def test_linear_drift_cancels_across_pairs() -> None:
    """A machine slowing 3% per run: alternating order keeps a placebo near 1."""
    machine = Machine({"": 100.0}, 0.0, 3, drift=-0.03)
    bench = Bench(machine.launch, figure_of=lambda run: run.summary)
    arm = bench.add(Arm("p", PLACEBO, {}, {}))
    for _ in range(4):
        bench.pair(arm)
    assert math.exp(sum(arm.logs()) / 4) == pytest.approx(1.0, abs=1e-9)


def test_a_failed_arm_run_is_recorded_and_ends_the_pair() -> None:
    def launch(tag: str, changes: Mapping[str, Any], control: str) -> RunOutcome:
        if tag == "candidate":
            return RunOutcome("bad", ok=False, error="exit status 1")
        return RunOutcome("ok", ok=True, summary={"wall": 1.0})

    bench = Bench(launch, figure_of=lambda run: run.summary)
    arm = bench.add(Arm("x", "candidate", {"x": 1}, {}))
    assert "exit status 1" in bench.pair(arm)
    assert arm.failure is not None and arm.pairs == []
    assert bench.judge(arm) == "more" and bench.interval(arm) is None


def test_record_holds_the_evidence() -> None:
    _, bench, arm = _session(Machine({"": 100.0, "x=1": 300.0}, 0.05, 7), {"x": 1})
    record = bench.record(arm)
    assert record["pairs"] == len(arm.pairs) and len(record["runs"]) == len(arm.pairs)
    assert record["medians"]["arm"] > 2 * record["medians"]["reference"]
    assert record["noise"]["placebo_pairs"] == 3 and record["noise"]["df"] >= 3
    assert record["ratio"]["low"] > record["noise"]["floor"]


def _pairs(arm: Arm, ratios: list[float]) -> Arm:
    """Pairs of runs whose 'wall' figures have the given arm / reference ratios."""
    for i, ratio in enumerate(ratios):
        arm.pairs.append(Pair(RunOutcome("ref", ok=True, summary={"wall": 100.0}),
                              RunOutcome("arm", ok=True, summary={"wall": 100.0 * ratio}),
                              i % 2 == 1, lambda run: run.summary))
    return arm


def test_an_adoption_that_later_noise_swamps_is_revoked_with_what_came_after() -> None:
    bench = Bench(lambda *a: RunOutcome("x", ok=False), 0.05)
    bench.add(_pairs(Arm("placebo", PLACEBO, {}, {}), [1.01, 0.99, 1.00]))
    a = bench.add(_pairs(Arm("a", "candidate", {"a": 1}, {}), [1.30, 1.34]))
    strong = bench.add(_pairs(Arm("b", "candidate", {"b": 1}, {}), [5.0, 5.2]))
    # on the quiet pairs so far: both clear the floor (max(1.05, the placebo's bound))
    assert bench.judge(a) == "win" and bench.judge(strong) == "win"
    assert bench.rejudge([a, strong]) == ([a, strong], [])
    # a later arm shows the machine far noisier: pair ratios from 0.6x to 1.7x
    bench.add(_pairs(Arm("noisy", "candidate", {"c": 1}, {}), [1.7, 0.6, 1.6, 0.65]))
    sd, _ = bench.noise("wall")
    assert sd > 0.3
    # a's 1.32x no longer clears it (its interval now reaches below 1); b, measured on
    # top of a, goes with it although its own 5x still would
    assert bench.interval(a).low <= bench.floor("wall") < bench.interval(strong).low
    assert bench.rejudge([a, strong]) == ([], [a, strong])
    assert bench.rejudge([strong]) == ([strong], [])


def test_an_effect_that_dwarfs_the_noise_is_decided_in_one_pair() -> None:
    """22x on a machine whose runs differ by ~+-20%: two placebo pairs then one pair of
    the candidate win it (the sequential rule); a 1.4x effect gets more pairs."""
    wins_at = []
    for seed in range(20):
        machine = Machine({"": 10.0, "x=1": 220.0}, 0.14, seed)
        verdict, bench, arm = _session(machine, {"x": 1}, placebo_pairs=2)
        assert verdict == "win"
        wins_at.append(len(arm.pairs))
    assert max(wins_at) <= 2 and sorted(wins_at)[len(wins_at) // 2] == 1
    small = [len(_session(Machine({"": 10.0, "x=1": 14.0}, 0.14, s), {"x": 1},
                          placebo_pairs=2)[2].pairs) for s in range(20)]
    assert sum(small) > 1.5 * sum(wins_at)


def _ramped_run(steps: int, every: int, speed: float = 1.0,
                evals_from: int = 10**9) -> RunOutcome:
    """A run's logging windows when a step costs 75 ms up to step 40 and 135 ms after (a
    sequence ramp), / `speed`, with a 1.9 s evaluation at each multiple of 10 from
    `evals_from` on; 32 samples a step; a 2 s first window (start-up)."""
    windows, clock, busy, done = [], 2.0, 0.0, 0
    for step in range(1, steps + 1):
        cost = (0.075 if step <= 40 else 0.135) / speed
        clock, busy = clock + cost, busy + cost
        if step >= evals_from and step % 10 == 0:
            clock += 1.9
        if step % every == 0 or step == steps:
            windows.append(stats.WindowFigure(step, 32.0 * (step - done), busy, clock))
            busy, done = 0.0, step
    return RunOutcome(f"run{steps}", ok=True, windows=windows)


def test_runs_of_different_lengths_are_compared_on_the_steps_both_trained() -> None:
    """Two runs of the same plan, 56 and 91 steps (runs are sized by their plan's pace),
    the longer passing the job's first evaluation (step 80): alone, each run's own
    throughput differs by a third; over the steps both trained, by nothing. A plan 1.5x
    as fast shows as 1.5x the same way."""
    short, long = _ramped_run(56, 8), _ramped_run(91, 13, evals_from=80)
    alone = math.log(long.figures["wall"] / short.figures["wall"])
    assert abs(alone) > 0.3  # what the pair would have measured from each run alone
    for figure in ("wall", "step"):
        assert Pair(short, long, False).log_ratio(figure) == pytest.approx(0.0, abs=0.02)
        assert Pair(long, short, True).log_ratio(figure) == pytest.approx(0.0, abs=0.02)
    fast = _ramped_run(91, 13, speed=1.5)
    assert Pair(short, fast, False).log_ratio("wall") == pytest.approx(math.log(1.5),
                                                                        abs=0.02)
