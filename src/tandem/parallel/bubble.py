"""A pipeline schedule's predicted idle share per rank: its action table replayed with
measured per-action costs (forward, backward, weight gradient).

Each rank runs its actions in the table's order; an action starts when its rank is free
and what it needs is done: a forward needs the previous stage's forward of the same
micro-batch, a backward (full, or the input half of a zero-bubble split) the next stage's
backward (the last stage: its own forward), a weight-gradient action its stage's input
backward. Transfers are taken as instant, so the measured bubble, which includes them, is
at least the prediction when the link is slow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache

Action = tuple[int, str, int]  # (stage, "F" | "B" | "I" | "W", micro-batch)
COST_OF = {"F": "F", "B": "B", "I": "B", "W": "W"}  # measured as: B holds input halves


@lru_cache(maxsize=32)
def action_order(schedule: str, pp: int, virtual: int,
                 micro: int) -> tuple[tuple[Action, ...], ...]:
    """Per pp rank, the compute actions of one step of `schedule`, in the order it runs them."""
    if schedule == "GPipe":
        return tuple(tuple([(r, "F", k) for k in range(micro)] +
                           [(r, "B", k) for k in range(micro)]) for r in range(pp))
    if schedule == "1F1B":
        return tuple(_one_f_one_b(r, pp, micro) for r in range(pp))
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    from tandem.parallel.schedules import schedule_class

    table = get_schedule_ops(schedule_class(schedule), pp, micro, num_stages_per_rank=virtual)
    return tuple(tuple(_compute(row)) for row in table)


def _one_f_one_b(rank: int, pp: int, micro: int) -> tuple[Action, ...]:
    """PyTorch's Schedule1F1B on stage `rank`: pp - rank forwards, then one backward and
    one forward in turn, then the backwards left."""
    warm = min(micro, pp - rank)
    order: list[Action] = [(rank, "F", k) for k in range(warm)]
    for k in range(micro):
        order.append((rank, "B", k))
        if k + warm < micro:
            order.append((rank, "F", k + warm))
    return tuple(order)


def _compute(row: Sequence[object]) -> list[Action]:
    out: list[Action] = []
    for action in row:
        if action is None:
            continue
        for part in getattr(action, "sub_actions", None) or (action,):
            kind = part.computation_type.value
            if kind in COST_OF:
                out.append((part.stage_index, kind, part.microbatch_index))
    return out


def predicted_idle(order: Sequence[Sequence[Action]],
                   costs: Sequence[Mapping[str, float]],
                   overhead: Sequence[float] = ()) -> list[float]:
    """Per rank, the share of the step's span it is not computing, with `costs[r]` the
    seconds of one action of each kind ("F", "B", "W") on rank r and `overhead[r]` the
    schedule's own seconds around each of its actions (posting sends and receives: they
    delay the rank like work, but are not the model's compute)."""
    extra = list(overhead) or [0.0] * len(order)
    padded = [{k: v + extra[r] for k, v in c.items()} for r, c in enumerate(costs)]
    span, _ = replay(order, padded)
    _, busy = replay(order, costs)
    return [1.0 - b / span if span > 0 else 0.0 for b in busy]


def replay(order: Sequence[Sequence[Action]],
           costs: Sequence[Mapping[str, float]]) -> tuple[float, list[float]]:
    """The step's span and each rank's busy seconds when `order` runs at `costs`."""
    last = max(s for row in order for s, _, _ in row)
    done: dict[tuple[int, str, int], float] = {}
    free, busy, at = [0.0] * len(order), [0.0] * len(order), [0] * len(order)
    moved = True
    while moved:
        moved = False
        for r, row in enumerate(order):
            while at[r] < len(row):
                stage, kind, k = row[at[r]]
                needs = _needs(stage, kind, k, last)
                if any(n not in done for n in needs):
                    break
                start = max([free[r], *(done[n] for n in needs)])
                seconds = costs[r][COST_OF[kind]]
                done[(stage, COST_OF[kind], k)] = free[r] = start + seconds
                busy[r] += seconds
                at[r] += 1
                moved = True
    if any(a < len(row) for a, row in zip(at, order, strict=True)):
        raise ValueError("pipeline action table cannot finish: an action waits on one that "
                         "never runs")
    return max(free), busy


def _needs(stage: int, kind: str, k: int, last: int) -> list[tuple[int, str, int]]:
    if kind == "F":
        return [(stage - 1, "F", k)] if stage > 0 else []
    if kind == "W":
        return [(stage, "B", k)]
    return [(stage + 1, "B", k)] if stage < last else [(stage, "F", k)]


def per_action_costs(order: Sequence[Sequence[Action]],
                     seconds: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
    """Per rank, one action's cost of each kind: the rank's measured seconds per step of
    that kind over its number of such actions a step."""
    out = []
    for row, got in zip(order, seconds, strict=True):
        counts = {"F": 0, "B": 0, "W": 0}
        for _, kind, _ in row:
            counts[COST_OF[kind]] += 1
        out.append({c: got[c] / n if n else 0.0 for c, n in counts.items()})
    return out
