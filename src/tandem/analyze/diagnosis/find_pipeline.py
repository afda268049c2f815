"""The pipeline finding: stages idle in the schedule's bubble, or one stage slower than
the others, each with the gain the schedule's action table predicts for its remedy.

The prediction replays the schedule (`parallel.bubble`) at the stages' measured forward
and backward seconds per step: with twice the micro-batches each action takes half as
long; with balanced stages each rank takes the mean of their costs.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import Context, Finding, severity
from tandem.analyze.report.figures import Metric, per_rank, steady, steady_median
from tandem.monitor.catalogue import PP_BACKWARD_S, PP_BUBBLE, PP_BUBBLE_PREDICTED, PP_FORWARD_S

BUBBLE_SHARE = 0.15  # the stages' mean idle share that names the bubble
UNBALANCED = 1.15  # the slowest stage's busy time over the mean that names it
MIN_GAIN = 1.05  # a remedy predicted to gain less is not suggested


def pipeline_bubble(ctx: Context) -> Finding | None:
    """Mean measured idle share above BUBBLE_SHARE, with the remedies that pay."""
    measured = steady_median(ctx.groups, PP_BUBBLE)
    plan = ctx.plan or {}
    pp, micro = plan.get("pp"), ctx.accumulation
    schedule, virtual = plan.get("pp_schedule"), plan.get("pp_virtual") or 1
    if (measured is None or measured <= BUBBLE_SHARE or not isinstance(pp, int) or pp < 2
            or not micro or not isinstance(schedule, str)):
        return None
    costs = _costs(ctx.groups, pp)
    if costs is None:
        return None
    from tandem.parallel import bubble

    order = bubble.action_order(schedule, pp, virtual, micro)
    now, busy = bubble.replay(order, bubble.per_action_costs(order, costs))
    evidence = {"bubble": measured, "predicted": steady_median(ctx.groups, PP_BUBBLE_PREDICTED),
                "schedule": schedule, "stages": pp * virtual, "micro_batches": micro,
                "busy_s": busy}
    remedies: list[tuple[float, str, dict[str, object]]] = []
    for changes, what in _alternatives(schedule, pp, virtual, micro):
        try:
            alt = bubble.action_order(changes.get("plan.pp_schedule", schedule), pp,
                                      changes.get("plan.pp_virtual", virtual),
                                      changes.get("plan.pp_microbatches", micro))
        except ValueError:
            continue
        later, _ = bubble.replay(alt, bubble.per_action_costs(alt, costs))
        remedies.append((now / later, f"{what} (predicted {now / later:.2f}x if half the "
                         "work takes half the time: small pieces cost more on a CPU, so "
                         "the tuner measures it)", changes))
    slowest = max(range(pp), key=lambda r: busy[r])  # a pipeline rank
    mean_busy = statistics.fmean(busy)
    if mean_busy > 0 and busy[slowest] / mean_busy > UNBALANCED:
        even = [{k: statistics.fmean(c[k] for c in costs) for k in "FBW"}] * pp
        balanced, _ = bubble.replay(order, bubble.per_action_costs(order, even))
        evidence["slowest_stage_rank"] = slowest
        remedies.append((now / balanced, f"plan.pp_split: move work off pipeline rank "
                         f"{slowest}'s stage ({busy[slowest] / mean_busy:.2f}x the mean busy "
                         f"time; balanced stages predict {now / balanced:.2f}x)", {}))
    remedies = sorted((r for r in remedies if r[0] >= MIN_GAIN), key=lambda r: -r[0])
    # What the tuner can try as it is (a split needs the blocks' costs, which it has not).
    evidence["remedies"] = [{"changes": c, "predicted": g} for g, _, c in remedies if c]
    gain = remedies[0][0] if remedies else None
    return Finding(
        "pipeline-bubble", severity(measured, BUBBLE_SHARE), evidence,
        f"the pipeline's stages are idle {measured:.0%} of the step ({schedule}, "
        f"{pp * virtual} stages, {micro} micro-batches)"
        + (f"; the schedule's action table predicts {gain:.2f}x from the best remedy"
           if gain else "; no remedy the schedule's action table can price gains 5%"),
        [text for _, text, _ in remedies], predicted_speedup=gain)


def _alternatives(schedule: str, pp: int, virtual: int,
                  micro: int) -> list[tuple[dict[str, object], str]]:
    """Plans that keep the math: the same batch in twice the micro-batches; two stages
    per rank in an interleaved schedule."""
    out: list[tuple[dict[str, object], str]] = [(
        {"plan.pp_microbatches": 2 * micro},
        f"plan.pp_microbatches {micro} -> {2 * micro}: the same batch in smaller "
        "micro-batches fills the bubble")]
    if virtual == 1 and micro % pp == 0:
        out.append(({"plan.pp_schedule": "Interleaved1F1B", "plan.pp_virtual": 2},
                    f"plan.pp_schedule Interleaved1F1B with plan.pp_virtual 2: two smaller "
                    f"stages per rank shorten the fill and drain ({schedule} now)"))
    return out


def _costs(groups: Mapping[str, Sequence[Metric]], pp: int) -> list[dict[str, float]] | None:
    """Per stage of the first pipeline (the pipeline axis is the mesh's outermost: its
    ranks are `world / pp` apart), its steady forward and backward seconds per step (the
    weight-gradient halves of a zero-bubble schedule counted with the backward)."""
    out = []
    forward, backward = per_rank(groups.get(PP_FORWARD_S, ())), per_rank(
        groups.get(PP_BACKWARD_S, ()))
    stride = len(forward) // pp
    if stride < 1:
        return None
    for rank in range(0, pp * stride, stride):
        f, b = forward.get(rank), backward.get(rank)
        if not f or not b:
            return None
        fs, bs = (steady(sorted(x), [x[s] for s in sorted(x)])[1] for x in (f, b))
        out.append({"F": stats.median(fs), "B": stats.median(bs), "W": 0.0})
    return out
