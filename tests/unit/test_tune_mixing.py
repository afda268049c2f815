"""The mixing family of the tuner: a mixed-task job whose diagnosis names a stalling task
gets other shares proposed, judged by the time until every task met its target.

`MixRunner` is the simulated job of test_tune_session (its runs written into a real run
store, on a simulated clock) with two tasks: each task's loss after n of its own samples
is floor + exp(-n / tau), its share of the stream the job's (or data.mix's), so the step
at which each task meets its target follows from the shares alone (`steps_to_all`), an
independent computation the tuner's choices are checked against. The family's reading
of real runs is checked on a real two-task run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import tandem
from tandem.config import parse_mix
from tandem.monitor.catalogue import task_metric
from tandem.monitor.store import RunStore
from tandem.status import RunStatus
from tandem.tune import mixing
from tandem.tune.arms import TASKS
from tandem.tune.session import Settings, Tuner
from tandem.tune.trial import RunOutcome, TrialRunner
from tests.dist import mix_task
from tests.unit.test_tune_session import BATCH, SimRunner

STEPS, LOG_EVERY = 200, 20
EVAL_S = 0.64  # seconds an evaluation takes, in the summary (10 steps' worth)


class MixRunner(SimRunner):
    """A two-task job: tasks {name: (tau samples, floor)}, the script's own `shares`."""

    def __init__(self, root: Path, tasks: Mapping[str, tuple[float, float]],
                 shares: Mapping[str, float], gains: Mapping[tuple[str, Any], float]) -> None:
        # an evaluation every 20 steps costs a third of the wall time (`EVAL_S`)
        super().__init__(root, gains, noise=0.03, seed=1, job={"train.eval_every": 20})
        self.tasks, self.default = dict(tasks), dict(shares)

    def shares(self, changes: Mapping[str, Any]) -> dict[str, float]:
        """Each task's share of the stream under `changes`."""
        if not changes.get("data.mix"):
            return dict(self.default)
        weights, _ = parse_mix(str(changes["data.mix"]))
        assert weights is not None
        return {k: w / sum(weights.values()) for k, w in weights.items()}

    def loss(self, task: str, samples: float) -> float:
        tau, floor = self.tasks[task]
        return floor + math.exp(-samples / tau)

    def run(self, name: str, changes: Mapping[str, Any], steps: int, log_every: int,
            control: str = "", eval_every: int | None = None,
            watch: Callable[[], bool] | None = None) -> RunOutcome:
        started = self.now
        out = super().run(name, changes, steps, log_every, control, eval_every, watch)
        shares = self.shares(changes)
        with RunStore(self.store_path) as store:
            rid = store.run(name)["run_id"]
            windows = store.metrics(rid, name="samples_per_s", rank=-1)
            rows = []
            for w in windows:
                for task, share in shares.items():
                    value = self.loss(task, share * BATCH * w["step"])
                    rows += [(w["step"], -1, task_metric(task, what), v, w["time"])
                             for what, v in (("loss", value), ("eval_loss", value),
                                             ("share", share))]
            store.log_metrics(name, rows)
            summary = {**store.run(name)["summary"], "train_started_at": started + 3.0,
                       "eval_time_s": EVAL_S * steps / 20,
                       "wall_time_s": windows[-1]["time"] - started - 3.0}
            store.finish_run(name, RunStatus.COMPLETED, summary)
        fresh = self.read(name)
        fresh.wall_s, fresh.stopped = out.wall_s, out.stopped
        return fresh


def steps_to_all(runner: MixRunner, changes: Mapping[str, Any],
                 targets: Mapping[str, float]) -> float:
    """Steps until every task's loss is at most its target (inf: not within STEPS)."""
    shares = runner.shares(changes)
    worst = 0.0
    for task, goal in targets.items():
        tau, floor = runner.tasks[task]
        need = 0.0 if goal >= floor + 1 else -tau * math.log(goal - floor)
        steps = math.ceil(need / (shares[task] * BATCH) / LOG_EVERY) * LOG_EVERY
        worst = max(worst, steps)
    return worst if worst <= STEPS else math.inf


def _tune(tmp_path: Path, runner: MixRunner, targets: Mapping[str, float]) -> Tuner:
    texts = tuple(f"task/{t}/eval_loss<={v}" for t, v in targets.items())
    tuner = Tuner(runner, Settings(budget_s=3000.0, steps=STEPS, log_every=LOG_EVERY,
                                   task_targets=texts), "tune-mix", [],
                  echo=lambda text: None, clock=lambda: runner.now)
    tuner.run()
    return tuner


def _mixing(tuner: Tuner) -> dict[str, str]:
    return {r.changes["data.mix"]: r.status for r in tuner.records
            if r.kind == "candidate" and "data.mix" in r.changes}


def test_a_task_starved_by_its_weight_gets_the_share_that_reaches_every_target(
        tmp_path: Path) -> None:
    # 'b' has 3% of the stream and learns slowly: its loss stalls while 'a''s falls.
    runner = MixRunner(tmp_path, {"a": (2000.0, 0.0), "b": (20000.0, 0.0)},
                       {"a": 0.97, "b": 0.03}, {})
    targets = {"a": 0.1, "b": 0.9}
    tuner = _tune(tmp_path, runner, targets)
    stalled = [f for f in tuner.records[0].figures["findings"] if f["kind"] == "task-stalls"]
    assert [f["message"].split(":")[0] for f in stalled] == ["task 'b'"]
    # The largest move first, adopted at once; with it 'b' learns, and nothing stalls.
    # Only then is a sparser evaluation tried (the evaluations time the targets).
    assert _mixing(tuner) == {"a=1,b=1": "adopted"}
    tried = [next(iter(r.changes)) for r in tuner.records if r.kind == "candidate"]
    assert tried[0] == "data.mix" and "train.eval_every" in tried[1:]
    assert tuner.incumbent["data.mix"] == "a=1,b=1"
    # Independently: of the family's moves (equal shares, b's weight x4, x2) only equal
    # shares reach both targets within the run; the others leave 'b' short of its
    # target, as the current shares do.
    assert steps_to_all(runner, {}, targets) == math.inf
    moves = ["a=1,b=1", "a=0.8899,b=0.1101", "a=0.9417,b=0.05825"]
    reach = {mix: steps_to_all(runner, {"data.mix": mix}, targets) for mix in moves}
    assert [m for m, s in reach.items() if s < math.inf] == ["a=1,b=1"]
    adopted = next(r for r in tuner.records if r.status == "adopted")
    assert adopted.figures["figure"] == TASKS and adopted.figures["ratio"]["low"] > 1.5
    assert "to every task's target" in adopted.decision
    # the session's claim stays in samples/s: the shares change no throughput
    assert tuner.speed is not None and 0.9 < tuner.speed.estimate < 1.1


def test_a_plan_faster_in_samples_but_later_to_one_target_loses(tmp_path: Path) -> None:
    # 'b' is at its floor (its loss stalls because it has learnt all it can); more of
    # it would even run 30% more samples a second, but 'a' would reach its target later.
    runner = MixRunner(tmp_path, {"a": (2000.0, 0.0), "b": (10.0, 0.05)},
                       {"a": 0.8, "b": 0.2}, {("data.mix", "a=1,b=1"): 1.3})
    targets = {"a": 0.1, "b": 0.1}
    tuner = _tune(tmp_path, runner, targets)
    tried = _mixing(tuner)  # equal shares, b's weight x4 and x2: each later to 'a'
    assert set(tried) == {"a=1,b=1", "a=0.5,b=0.5", "a=0.6667,b=0.3333"}
    assert not any(s == "adopted" for s in tried.values())
    assert tuner.incumbent == {}
    base_steps = steps_to_all(runner, {}, targets)
    equal = next(a for a in tuner.bench.arms if a.changes.get("data.mix") == "a=1,b=1")
    ahead = sum(equal.logs("wall")) / len(equal.logs("wall"))
    later = sum(equal.logs(TASKS)) / len(equal.logs(TASKS))
    # samples/s 1.3x, seconds to every target (base_steps / 1) / (steps at 1/2 / 1.3)
    assert math.exp(ahead) == pytest.approx(1.3, rel=0.1)
    predicted = base_steps * 1.3 / steps_to_all(runner, {"data.mix": "a=1,b=1"}, targets)
    assert math.exp(later) == pytest.approx(predicted, rel=0.1) and predicted < 0.9


def test_task_targets_are_read_from_a_real_two_task_run(tmp_path: Path) -> None:
    mix_task.SEEN.clear()
    cfg = mix_task.config(str(tmp_path), 12, 20, train={"eval_every": 4},
                          monitor={"log_every": 4})
    tandem.fit(mix_task.task(), config=cfg)
    run = TrialRunner("x.py", [], 1, tmp_path, tmp_path / "tandem.db").read("mix")
    with RunStore(tmp_path / "tandem.db") as store:
        rid = store.run("mix")["run_id"]
        rows = store.metrics(rid, name="task/reg/eval_loss", rank=-1)
        started = store.run("mix")["summary"]["train_started_at"]
    assert [v for _, v in run.tasks["task/reg/eval_loss"]] == [r["value"] for r in rows]
    assert len(rows) == 3
    defaults = mixing.baseline_targets(run)
    assert defaults == [("task/cls/eval_loss", "<=", run.tasks["task/cls/eval_loss"][-1][1]),
                        ("task/reg/eval_loss", "<=", rows[-1]["value"])]
    # A goal met at the second evaluation, the other at none: the run never met both.
    second = rows[1]["time"] - started
    goal = ("task/reg/eval_loss", "<=", rows[1]["value"])
    assert mixing.seconds_to(run, goal) == pytest.approx(
        min(r["time"] - started for r in rows if r["value"] <= rows[1]["value"]))
    assert mixing.seconds_to(run, goal) <= second
    never = ("task/cls/accuracy", ">=", 1.01)
    assert mixing.figure(run, [goal, never]) == {
        TASKS: pytest.approx(1 / (2.0 * run.summary["wall_time_s"]))}
    assert mixing.figure(run, [goal]) == {TASKS: pytest.approx(1 / mixing.seconds_to(run, goal))}


@pytest.mark.parametrize("text", ["accuracy>=0.9", "task/reg>=1", "task/reg/eval_loss=1"])
def test_a_task_target_that_names_no_tasks_metric_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="task/NAME/METRIC|not a goal"):
        mixing.parse_targets([text])
