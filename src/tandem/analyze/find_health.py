"""The health finding: a run whose numbers went wrong (NaN, spikes, a falling loss scale)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tandem.analyze import stats
from tandem.analyze.figures import Metric, series_of
from tandem.analyze.finding import Finding

LOSS_SPIKE_Z = 6.0
LOSS_SPIKE_MIN_RISE = 0.05
LOSS_SPIKE_MIN_WINDOWS = 8
LOSS_SCALE_DROPS = 3
# Event kinds (compared lower-case, "_" read as "-") that mean the math went wrong;
# monitor.detect writes nonfinite, loss_spike and grad_explosion.
UNSTABLE_EVENT_KINDS = frozenset({
    "nan", "non-finite", "nonfinite", "loss-spike", "grad-spike", "grad-explosion",
    "divergence", "overflow", "skipped-step"})
SEVERE_EVENT_KINDS = frozenset({"nan", "non-finite", "nonfinite", "divergence"})


def event_kind(kind: object) -> str:
    """An event kind in the form UNSTABLE_EVENT_KINDS uses (lower case, "-" for "_")."""
    return str(kind).lower().replace("_", "-")


def _loss_spikes(groups: Mapping[str, Sequence[Metric]]) -> list[int]:
    steps, loss = series_of(groups, "loss")
    good = [(s, v) for s, v in zip(steps, loss, strict=True) if math.isfinite(v)]
    if len(good) < LOSS_SPIKE_MIN_WINDOWS:
        return []
    rises = [b[1] - a[1] for a, b in zip(good, good[1:], strict=False)]
    z = stats.robust_z(rises)
    return [good[i + 1][0] for i, (rise, score) in enumerate(zip(rises, z, strict=True))
            if score > LOSS_SPIKE_Z and rise > LOSS_SPIKE_MIN_RISE * abs(good[i][1])]


def unstable(groups: Mapping[str, Sequence[Metric]], events: Iterable[Mapping[str, Any]],
              config: Mapping[str, Any] | None) -> Finding | None:
    nonfinite = sorted({int(m["step"]) for name in ("loss", "grad_norm")
                        for m in groups.get(name, ()) if not math.isfinite(m["value"])})
    flagged = [e for e in events if event_kind(e.get("kind", "")) in UNSTABLE_EVENT_KINDS]
    spikes = _loss_spikes(groups)
    _, scale = series_of(groups, "loss_scale")
    drops = sum(b < a for a, b in zip(scale, scale[1:], strict=False))
    if not (nonfinite or flagged or spikes or drops >= LOSS_SCALE_DROPS):
        return None
    parts = []
    if nonfinite:
        parts.append(f"non-finite loss/grad norm at {len(nonfinite)} logged step(s) "
                     f"(first at step {nonfinite[0]})")
    if flagged:
        kinds = sorted({str(e["kind"]) for e in flagged})
        parts.append(f"{len(flagged)} instability event(s) ({', '.join(kinds)}; first at "
                     f"step {min(int(e['step']) for e in flagged)})")
    if spikes:
        parts.append(f"{len(spikes)} loss spike(s) over {LOSS_SPIKE_Z:g} robust z "
                     f"(at step {', '.join(map(str, spikes[:5]))})")
    if drops >= LOSS_SCALE_DROPS:
        parts.append(f"the fp16 loss scale fell in {drops} windows")
    severe = bool(nonfinite) or any(event_kind(e["kind"]) in SEVERE_EVENT_KINDS
                                    for e in flagged)
    suggestions = ["train.grad_clip 1.0: bound the update when a batch is unusual",
                   "optim.warmup_steps: a longer warm-up, or a lower learning rate"]
    if _precision(config) == "fp16" or drops >= LOSS_SCALE_DROPS:
        suggestions.insert(0, "precision.mode bf16: fp16's range overflows; bf16 needs no "
                              "loss scaling")
    return Finding(
        "unstable", "high" if severe else "medium",
        {"nonfinite_steps": nonfinite, "events": len(flagged), "spike_steps": spikes,
         "loss_scale_drops": drops},
        "training is unstable: " + "; ".join(parts) + " -> clip gradients, warm up longer "
        "or lower the learning rate" + (", or switch fp16 to bf16" if drops else ""),
        suggestions)




def _precision(config: Mapping[str, Any] | None) -> Any:
    train = config.get("precision") if isinstance(config, Mapping) else None
    return train.get("mode") if isinstance(train, Mapping) else None
