"""The pipeline-bubble finding: its remedies priced by replaying the schedule, checked
against the closed form of GPipe."""

from __future__ import annotations

from typing import Any

import pytest

from tandem.analyze.diagnosis.diagnose import diagnose
from tandem.tune import space

PLAN = {"strategy": "pp", "pp": 2, "pp_schedule": "GPipe", "pp_virtual": 1,
        "accumulation": 2, "world_size": 2}


def _rows(bubble: float, forward: list[float], backward: list[float],
          windows: int = 6) -> list[dict[str, Any]]:
    rows = []
    for w in range(1, windows + 1):
        step = 10 * w
        rows += [{"step": step, "rank": -1, "name": "pp/bubble", "value": bubble, "time": w},
                 {"step": step, "rank": -1, "name": "time/step", "value": 1.0, "time": w}]
        for rank, (f, b) in enumerate(zip(forward, backward, strict=True)):
            rows += [{"step": step, "rank": rank, "name": "pp/forward_s", "value": f,
                      "time": w},
                     {"step": step, "rank": rank, "name": "pp/backward_s", "value": b,
                      "time": w}]
    return rows


def _finding(rows: list[dict[str, Any]], plan: dict[str, Any] = PLAN) -> Any:
    found = [f for f in diagnose(rows, plan=plan) if f.kind == "pipeline-bubble"]
    return found[0] if found else None


def test_more_micro_batches_are_priced_by_the_closed_form() -> None:
    # Equal stages, GPipe, p = 2: the span is (m + p - 1) actions of f + b. Going from
    # m = 2 to 4 micro-batches of half the size: 3 (f + b) -> 5 (f + b) / 2, 1.2x.
    finding = _finding(_rows(0.33, [0.2, 0.2], [0.4, 0.4]))
    assert finding is not None and finding.severity == "high"
    assert finding.predicted_speedup == pytest.approx(3 / 2.5)
    assert finding.suggestions[0].startswith("plan.pp_microbatches 2 -> 4")
    assert not any("pp_split" in s for s in finding.suggestions)  # the stages are even
    # The tuner tries what the finding priced, as candidates that keep the math.
    candidates = space.pipeline_remedies(finding, "pipeline-bubble")
    assert candidates[0].changes == {"plan.pp_microbatches": 4} and not candidates[0].lossy
    assert candidates[0].predicted == pytest.approx(1.2)
    assert space.families_of([finding]) == {"pipeline": finding}


def test_a_slow_stage_is_named_with_the_gain_of_balancing_it() -> None:
    # GPipe, m = 2, per action: rank 0 f=0.1 b=0.2, rank 1 f=0.3 b=0.6 (3x). Span:
    # 0.1 + 2 x 0.3 + 2 x 0.6 + 0.2 = 2.1; balanced (f=0.2, b=0.4): 3 x 0.6 = 1.8.
    finding = _finding(_rows(0.4, [0.2, 0.6], [0.4, 1.2]))
    assert finding.evidence["slowest_stage_rank"] == 1
    split = [s for s in finding.suggestions if s.startswith("plan.pp_split")]
    assert split and f"{2.1 / 1.8:.2f}x" in split[0]


def test_no_finding_below_the_threshold_or_without_a_pipeline() -> None:
    assert _finding(_rows(0.05, [0.2, 0.2], [0.4, 0.4])) is None
    assert _finding(_rows(0.33, [0.2, 0.2], [0.4, 0.4]), plan={"strategy": "ddp"}) is None
