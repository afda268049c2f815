"""The predicted pipeline bubble: PyTorch's action tables replayed with per-action costs,
against the closed forms of GPipe and 1F1B."""

from __future__ import annotations

import pytest

from tandem.parallel import bubble
from tandem.parallel.schedules import SCHEDULES


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
@pytest.mark.parametrize("pp,micro", [(2, 2), (2, 8), (4, 4), (4, 8)])
def test_single_stage_schedules_match_the_closed_form(schedule: str, pp: int,
                                                       micro: int) -> None:
    # Equal stages, forward f and backward b: the step spans (m + p - 1)(f + b) and each
    # rank computes m(f + b), so each rank idles (p - 1) / (m + p - 1).
    f, b = 0.3, 0.7
    order = bubble.action_order(schedule, pp, 1, micro)
    idle = bubble.predicted_idle(order, [{"F": f, "B": b, "W": 0.0}] * pp)
    assert idle == pytest.approx([(pp - 1) / (micro + pp - 1)] * pp)


def test_a_slow_stage_sets_the_span() -> None:
    # GPipe, 2 stages, the second 3x slower: span = f0 + m*f1 + m*b1 + b0.
    f0, b0, f1, b1, m = 1.0, 2.0, 3.0, 6.0, 4
    order = bubble.action_order("GPipe", 2, 1, m)
    idle = bubble.predicted_idle(order, [{"F": f0, "B": b0, "W": 0}, {"F": f1, "B": b1, "W": 0}])
    span = f0 + m * f1 + m * b1 + b0
    assert idle == pytest.approx([1 - m * (f0 + b0) / span, 1 - m * (f1 + b1) / span])


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_the_schedules_own_time_lengthens_the_span_but_is_not_compute(schedule: str) -> None:
    # Equal stages with o seconds of the schedule's own around each action: the span is
    # the closed form's at f + o and b + o, and each rank computes only m(f + b) of it.
    f, b, o, pp, m = 0.3, 0.7, 0.1, 2, 4
    order = bubble.action_order(schedule, pp, 1, m)
    idle = bubble.predicted_idle(order, [{"F": f, "B": b, "W": 0.0}] * pp, [o] * pp)
    span = (m + pp - 1) * (f + b + 2 * o)
    assert idle == pytest.approx([1 - m * (f + b) / span] * pp)


def test_one_f_one_b_order_is_pytorchs() -> None:
    # Stage 0 of 2, 4 micro-batches: two forwards, then backward and forward in turn.
    assert [f"{k}{i}" for _, k, i in bubble.action_order("1F1B", 2, 1, 4)[0]] == \
        ["F0", "F1", "B0", "F2", "B1", "F3", "B2", "B3"]


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_every_schedule_replays_to_a_bubble_between_zero_and_one(schedule: str) -> None:
    virtual = 1 if not SCHEDULES[schedule].multi else 2
    order = bubble.action_order(schedule, 2, virtual, 4)
    assert sum(len(row) for row in order) >= 2 * virtual * 4 * 2  # every F and backward
    costs = bubble.per_action_costs(order, [{"F": 1.0, "B": 2.0, "W": 0.5}] * 2)
    idle = bubble.predicted_idle(order, costs)
    assert all(0.0 <= x < 1.0 for x in idle)


def test_costs_are_split_over_a_ranks_actions() -> None:
    order = bubble.action_order("GPipe", 2, 1, 4)
    costs = bubble.per_action_costs(order, [{"F": 4.0, "B": 8.0, "W": 0.0}] * 2)
    assert costs[0] == {"F": 1.0, "B": 2.0, "W": 0.0}


def test_a_table_that_cannot_finish_is_named() -> None:
    with pytest.raises(ValueError, match="cannot finish"):
        bubble.predicted_idle([[(0, "B", 0)], [(1, "F", 0)]], [{"F": 1, "B": 1, "W": 0}] * 2)
