"""The health finding: a run whose numbers went wrong (NaN, spikes, a falling loss scale).

A spike counts only when it is material on the run's own scale: a loss outlier at a
loss above SMALL_LOSS_SHARE of the loss the run started at, a gradient-norm outlier
above the norm it started at (each the largest of its first START_WINDOWS windows). A
model that fits its training data has heavy-tailed per-batch losses: late in training
one batch's loss can be ten times the last window's and still be a few percent of the
starting loss, with gradient norms that clipping at 1.0 would not touch. Such outliers
are reported as one "info" finding ("outliers"), never as an instability.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import Finding
from tandem.analyze.report.figures import Metric, series_of
from tandem.monitor.catalogue import GRAD_NORM, LOSS, LOSS_SCALE

LOSS_SPIKE_Z = 6.0
LOSS_SPIKE_MIN_RISE = 0.05
LOSS_SPIKE_MIN_WINDOWS = 8
LOSS_SCALE_DROPS = 3
START_WINDOWS = 3  # a metric's starting level: the largest of its first windows
SMALL_LOSS_SHARE = 0.05  # a loss outlier at most this share of the starting loss is small
# Event kinds (compared lower-case, "_" read as "-") that mean the math went wrong;
# monitor.detect writes nonfinite, loss_spike and grad_explosion.
UNSTABLE_EVENT_KINDS = frozenset({
    "nan", "non-finite", "nonfinite", "loss-spike", "grad-spike", "grad-explosion",
    "divergence", "overflow", "skipped-step"})
SEVERE_EVENT_KINDS = frozenset({"nan", "non-finite", "nonfinite", "divergence"})


def event_kind(kind: object) -> str:
    """An event kind in the form UNSTABLE_EVENT_KINDS uses (lower case, "-" for "_")."""
    return str(kind).lower().replace("_", "-")


def start_level(groups: Mapping[str, Sequence[Metric]], name: str) -> float | None:
    """The largest of the first START_WINDOWS finite values of a job-wide series."""
    _, values = series_of(groups, name)
    first = [abs(v) for v in values if math.isfinite(v)][:START_WINDOWS]
    return max(first) if first else None


def _loss_spikes(groups: Mapping[str, Sequence[Metric]],
                 start: float | None) -> tuple[list[int], list[int]]:
    """Steps of loss outliers: (material, small) on the run's starting loss."""
    steps, loss = series_of(groups, LOSS)
    good = [(s, v) for s, v in zip(steps, loss, strict=True) if math.isfinite(v)]
    if len(good) < LOSS_SPIKE_MIN_WINDOWS:
        return [], []
    rises = [b[1] - a[1] for a, b in zip(good, good[1:], strict=False)]
    z = stats.robust_z(rises)
    material: list[int] = []
    small: list[int] = []
    for i, (rise, score) in enumerate(zip(rises, z, strict=True)):
        if score > LOSS_SPIKE_Z and rise > LOSS_SPIKE_MIN_RISE * abs(good[i][1]):
            big = start is None or good[i + 1][1] > SMALL_LOSS_SHARE * start
            (material if big else small).append(good[i + 1][0])
    return material, small


def start_levels(groups: Mapping[str, Sequence[Metric]]) -> tuple[float | None, float | None]:
    """The run's starting loss and gradient norm: the scale its outliers are judged on."""
    return start_level(groups, LOSS), start_level(groups, GRAD_NORM)


def small_outlier(event: Mapping[str, Any], loss0: float | None, grad0: float | None) -> bool:
    """Whether a detector's outlier event is small on the run's own starting scale: a
    loss at most SMALL_LOSS_SHARE of the starting loss, a gradient norm at most the
    starting one. The health finding calls such events outliers, not instability; charts
    mark them so too."""
    kind, value = event_kind(event.get("kind", "")), event.get("value")
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    if kind == "loss-spike" and loss0 is not None:
        return value <= SMALL_LOSS_SHARE * loss0
    if kind in ("grad-spike", "grad-explosion") and grad0 is not None:
        return value <= grad0
    return False


def unstable(groups: Mapping[str, Sequence[Metric]], events: Iterable[Mapping[str, Any]],
              config: Mapping[str, Any] | None) -> Finding | None:
    nonfinite = sorted({int(m["step"]) for name in (LOSS, GRAD_NORM)
                        for m in groups.get(name, ()) if not math.isfinite(m["value"])})
    loss0, grad0 = start_levels(groups)
    outliers = [e for e in events if event_kind(e.get("kind", "")) in UNSTABLE_EVENT_KINDS]
    small: list[Mapping[str, Any]] = []
    flagged: list[Mapping[str, Any]] = []
    for e in outliers:  # one pass: a long run has hundreds of events
        (small if small_outlier(e, loss0, grad0) else flagged).append(e)
    spikes, small_spikes = _loss_spikes(groups, loss0)
    _, scale = series_of(groups, LOSS_SCALE)
    drops = sum(b < a for a, b in zip(scale, scale[1:], strict=False))
    if not (nonfinite or flagged or spikes or drops >= LOSS_SCALE_DROPS):
        if small or small_spikes:
            return _small_outliers(small, small_spikes, loss0, grad0)
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


def _small_outliers(events: Sequence[Mapping[str, Any]], spikes: Sequence[int],
                    loss0: float | None, grad0: float | None) -> Finding:
    """Outliers that are small on the run's own scale: said, not called an instability."""
    losses = [float(e["value"]) for e in events if event_kind(e["kind"]) == "loss-spike"]
    grads = [float(e["value"]) for e in events if event_kind(e["kind"]) != "loss-spike"]
    parts = []
    if losses and loss0:
        parts.append(f"the largest loss at an outlier {max(losses):.3g} "
                     f"({max(losses) / loss0:.1%} of the starting {loss0:.3g})")
    if spikes and loss0:
        parts.append(f"{len(spikes)} rise(s) between windows, each to under "
                     f"{SMALL_LOSS_SHARE:.0%} of the starting loss")
    if grads and grad0:
        unclipped = "; clipping at 1.0 would not touch them" if max(grads) < 1.0 else ""
        parts.append(f"the largest gradient norm {max(grads):.3g} (the run started at "
                     f"{grad0:.3g}{unclipped})")
    return Finding(
        "outliers", "info",
        {"events": len(events), "spike_steps": list(spikes),
         "max_loss": max(losses, default=None), "max_grad_norm": max(grads, default=None),
         "start_loss": loss0, "start_grad_norm": grad0},
        f"{len(events) + len(spikes)} per-batch loss or gradient outlier(s), all small on "
        "this run's scale: " + "; ".join(parts) + ". A model that fits its training data "
        "has heavy-tailed batch losses; this is not an instability",
        [])
