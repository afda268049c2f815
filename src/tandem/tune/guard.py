"""The convergence guardrail: a lossy change must train as well as the plan it replaces.

A candidate that changes the numerics (gradient compression, precision, batch split,
local SGD / DiLoCo, optimizer settings) is run for the same steps as the baseline from
the same starting point: every trial run has the same `run.seed`, so both start from
the same initial weights and see the same samples in the same order. Their losses over
those steps are compared:

    smoothed final loss = mean of the last SMOOTH_WINDOWS logged window losses
    rejected when       candidate > baseline * (1 + REL_TOL) + ABS_TOL,
                        or the candidate's smoothed loss is not finite

REL_TOL is 5% and ABS_TOL 1e-3 (so that a loss near zero is not held to an impossible
relative bound). A change that trains faster per second but worse per step is thus
rejected even when its throughput wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

REL_TOL = 0.05
ABS_TOL = 1e-3
SMOOTH_WINDOWS = 3


@dataclass(frozen=True)
class GuardResult:
    """The comparison of two loss curves over the same steps."""

    ok: bool
    baseline_loss: float
    candidate_loss: float
    limit: float
    steps: int
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ok": self.ok, "baseline_loss": self.baseline_loss,
                "candidate_loss": self.candidate_loss, "limit": self.limit,
                "steps": self.steps, "rel_tol": REL_TOL, "abs_tol": ABS_TOL}


def smoothed_final(losses: Sequence[tuple[int, float]], windows: int = SMOOTH_WINDOWS) -> float:
    """Mean of the last `windows` window losses (NaN if any of them is not finite)."""
    if not losses:
        return math.nan
    tail = [v for _, v in sorted(losses)[-windows:]]
    return math.fsum(tail) / len(tail) if all(math.isfinite(v) for v in tail) else math.nan


def compare(baseline: Sequence[tuple[int, float]], candidate: Sequence[tuple[int, float]],
            rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> GuardResult:
    """Accept or reject the candidate's loss curve against the baseline's."""
    base_steps = {s for s, _ in baseline}
    cand_steps = {s for s, _ in candidate}
    common = base_steps & cand_steps
    steps = max(common) if common else 0
    b = smoothed_final([(s, v) for s, v in baseline if s in common])
    c = smoothed_final([(s, v) for s, v in candidate if s in common])
    if not common or not math.isfinite(b):
        return GuardResult(False, b, c, math.nan, steps,
                           "no baseline loss over the same steps to compare with")
    limit = b * (1 + rel_tol) + abs_tol
    if not math.isfinite(c):
        return GuardResult(False, b, c, limit, steps,
                           f"diverged: loss not finite by step {steps}")
    if c > limit:
        return GuardResult(False, b, c, limit, steps,
                           f"loss {c:.4g} at step {steps} > limit {limit:.4g} (baseline "
                           f"{b:.4g} x {1 + rel_tol:g} + {abs_tol:g})")
    return GuardResult(True, b, c, limit, steps,
                       f"loss {c:.4g} at step {steps} within limit {limit:.4g} "
                       f"(baseline {b:.4g})")
