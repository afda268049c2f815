"""What a tuning session tries next: the smells' fixes and the candidates sized from the
job's measurements, then the remedies of each diagnosed family (behind its control),
largest predicted gain first (a mixture's other shares, `mixing.py`, after them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tandem.tune import controls, mixing, sizing, space
from tandem.tune.space import Candidate


def proposals(smells: Iterable[Any], measured: Any, findings: Sequence[Any],
              base: Mapping[str, Any], min_gain: float) -> list[Candidate]:
    """Candidates for the plan `base` (the job with the adopted changes), as measured."""
    queue = [smell.candidate() for smell in smells]
    seen = [c.changes for c in queue]
    queue += [c for c in sizing.proposals(measured, min_gain) if c.changes not in seen]
    families = space.families_of(findings)
    if "mixing" in families:  # its runs read the time to each target at the evaluations
        queue = [c for c in queue if mixing.CADENCE not in c.changes]
    for family, finding in families.items():
        reason = f"{finding.kind}: {finding.message.split(' -> ')[0]}"
        predicted = controls.predicted_of(finding)
        if family == "comm":
            queue += space.comm_remedies(base, reason, measured.world, predicted)
        elif family == "memory":
            queue += space.memory_remedies(base, reason, measured.world)
        elif family == "compute":
            queue += space.compute_remedies(base, reason, measured.on_gpu)
        elif family == "pipeline":
            queue += space.pipeline_remedies(finding, reason)
        elif family == "mixing":
            queue += mixing.remedies(finding, base, reason)
    return by_predicted_gain(queue)


def by_predicted_gain(queue: Sequence[Candidate]) -> list[Candidate]:
    """The candidates, largest predicted gain first (those without a prediction after,
    in their own order)."""
    return sorted(queue, key=lambda c: -(c.predicted or 0.0))


def predicted_text(predicted: float | None) -> str:
    """A candidate's prediction in words."""
    return f"predicted {predicted:.3g}x" if predicted else "no prediction"
