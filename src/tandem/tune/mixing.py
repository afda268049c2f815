"""The mixing family: when the diagnosis names a task of a mixture that stalls while
others learn (`task-stalls`), other shares of the mixture are tried (`data.mix`), and
judged by the time until every task has reached its target.

Remedies, from the shares the run measured (`task/NAME/share`, in the finding's
evidence), the largest move first: equal shares and, with a temperature mixture, a
temperature twice as high (flatter), when the task's share is below an equal one; then
its weight x4 and x2 (the others' kept). Each is a candidate of figure TASKS: a run's
figure is 1 / the seconds of training (from its first step) until the last task met its
target at an evaluation, so a plan that reaches one task's target sooner but another's
later than the plan it replaces reaches *every* target later, and loses; a task whose
target the run never met counts PENALTY x the run's training time (a miss is worse than
any hit in a run as long). The runs are paired and judged like every other arm
(`arms.py`): the placebo's runs give the figure's noise too. A change of shares changes
what the loss averages, so the loss guardrail does not apply: reaching the targets is
the convergence check.

Targets: `--task-target 'task/NAME/METRIC>=V'` (or <=), one or more; without them, each
task's evaluation loss where the baseline run ended (`task/NAME/eval_loss<=last`), so a
plan must match the current plan's quality on every task, sooner. Evaluations follow
the job's own `train.eval_every`: the time to a target is as fine as that cadence, so
while the family is in play the tuner proposes no other cadence (a sparser one, adopted
first for its throughput, would leave the mixtures' runs a single evaluation at the end).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tandem.config import parse_mix, parse_target
from tandem.config.values import target_met
from tandem.monitor.catalogue import TASK_EVAL_LOSS, TASK_PREFIX, task_kind
from tandem.tune.arms import TASKS
from tandem.tune.hparams import PENALTY
from tandem.tune.space import Candidate
from tandem.tune.trial import RunOutcome

CADENCE = "train.eval_every"  # not traded away while a mixture's shares are judged
FACTORS = (4.0, 2.0)  # the stalled task's weight times these
Target = tuple[str, str, float]


def parse_targets(texts: Sequence[str]) -> list[Target]:
    """--task-target values as (metric, op, value); ValueError naming a bad one."""
    out = []
    for text in texts:
        target = parse_target(text)
        if not target[0].startswith(TASK_PREFIX) or target[0].count("/") != 2:
            raise ValueError(f"--task-target {text!r}: name a task's metric, "
                             "'task/NAME/METRIC>=VALUE' or '<=', e.g. "
                             "'task/digit/accuracy>=0.9' or 'task/parity/eval_loss<=0.3'")
        out.append(target)
    return out


def baseline_targets(run: RunOutcome) -> list[Target]:
    """Each task's evaluation loss where `run` ended (<=): the default targets."""
    what = task_kind(TASK_EVAL_LOSS)
    return [(name, "<=", series[-1][1]) for name, series in sorted(run.tasks.items())
            if name.endswith("/" + what) and series]


def seconds_to(run: RunOutcome, target: Target) -> float | None:
    """Seconds of training until `run` first met `target` at an evaluation (None: never,
    or the run did not evaluate that metric)."""
    metric, _, _ = target
    for elapsed, value in run.tasks.get(metric, ()):
        if math.isfinite(value) and target_met(target, {metric: value}) is not None:
            return elapsed
    return None


def figure(run: RunOutcome, targets: Sequence[Target]) -> dict[str, float]:
    """{TASKS: 1 / seconds until every target was met} ({} without targets, or when the
    run evaluated none of their metrics)."""
    if not targets or not any(t[0] in run.tasks for t in targets):
        return {}
    times = [seconds_to(run, t) for t in targets]
    if any(t is None for t in times):
        trained = float(run.summary.get("wall_time_s") or 0.0) or max(
            (e for series in run.tasks.values() for e, _ in series), default=0.0)
        seconds = PENALTY * trained
    else:
        seconds = max(times)  # type: ignore[type-var]
    return {TASKS: 1.0 / seconds} if seconds > 0 else {}


def _mix_text(shares: Mapping[str, float]) -> str:
    return ",".join(f"{name}={share:.4g}" for name, share in shares.items())


def remedies(finding: Any, base: Mapping[str, Any], reason: str) -> list[Candidate]:
    """Other shares for the mixture whose task `finding` names (see the module
    docstring); none without the run's measured shares."""
    task = finding.evidence.get("task")
    shares = dict(finding.evidence.get("shares") or {})
    if task not in shares or len(shares) < 2 or not 0 < shares[task] < 1:
        return []
    own = shares[task]
    plans: list[str] = []
    current = str(base.get("data.mix") or "")
    if own < 1 / len(shares):  # the largest move first: a starved task shows at once
        plans.append(_mix_text(dict.fromkeys(shares, 1.0)))
        temperature = parse_mix(current)[1] if current else None
        if temperature is not None:
            plans.append(f"temperature={2 * temperature:g}")
    for factor in FACTORS:
        total = own * factor + (1 - own)
        plans.append(_mix_text({n: (s * factor if n == task else s) / total
                                for n, s in shares.items()}))
    return [Candidate({"data.mix": text}, "mixing", reason, figure=TASKS)
            for text in dict.fromkeys(plans) if text != current]
