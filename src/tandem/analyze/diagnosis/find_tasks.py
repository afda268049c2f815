"""Joint training: a source of a mixture whose loss stalls or rises while another's
falls.

Each source's evaluation loss (`task/NAME/eval_loss`, on its own eval data) and its
training loss (`task/NAME/loss`) are split in thirds of their points; a source's change
is the median of the last third over the median of the first, less one. A source that
fell by less than TASK_STALL (2%), or rose, while another fell by at least TASK_FALL
(10%), is named: it gains nothing from the steps the mixture gives it (converged,
starved by its share, or pulled the other way by the other tasks' gradients). The
evaluation decides first: a source starved to a few samples learns them by heart, so
its training loss falls while its evaluation loss rises. The evidence holds every
source's share of the last window, from which the tuner proposes others (`tune/mixing`).
"""

from __future__ import annotations

import statistics

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import Context, Finding
from tandem.analyze.report.figures import series_of, task_names
from tandem.monitor.catalogue import TASK_EVAL_LOSS, TASK_LOSS, TASK_SHARE, task_kind

TASK_STALL = 0.02
TASK_FALL = 0.10
TASK_MIN_WINDOWS = 6
TASK_EVAL, TASK_TRAIN = task_kind(TASK_EVAL_LOSS), task_kind(TASK_LOSS)


def _change(values: list[float]) -> float | None:
    """Median of the last third over the median of the first third, less one."""
    finite = stats.finite(values)
    if len(finite) < TASK_MIN_WINDOWS:
        return None
    third = len(finite) // 3
    first, last = statistics.median(finite[:third]), statistics.median(finite[-third:])
    return last / first - 1 if first > 0 else None


def task_stalls(ctx: Context) -> list[Finding]:
    """One finding per source whose loss stalled or rose while another's fell: by the
    evaluation loss (each source's own eval data) first, then by the training loss."""
    changes: dict[str, dict[str, float]] = {TASK_EVAL: {}, TASK_TRAIN: {}}
    shares: dict[str, float] = {}  # each source's share of the last window
    for name, (source, what) in task_names(ctx.groups).items():
        values = series_of(ctx.groups, name)[1]
        if what in changes and (change := _change(values)) is not None:
            changes[what][source] = change
        elif what == task_kind(TASK_SHARE) and values:
            shares[source] = values[-1]
    out: dict[str, Finding] = {}
    for what, label in ((TASK_EVAL, "evaluation"), (TASK_TRAIN, "training")):
        for source, finding in _stalls(changes[what], label, shares).items():
            out.setdefault(source, finding)
    return [out[s] for s in sorted(out)]


def _stalls(changes: dict[str, float], label: str, shares: dict[str, float]
            ) -> dict[str, Finding]:
    falling = {s: c for s, c in changes.items() if c <= -TASK_FALL}
    if not falling:
        return {}
    fell = ", ".join(f"{s} {c:+.0%}" for s, c in sorted(falling.items()))
    out = {}
    for source, change in sorted(changes.items()):
        if change <= -TASK_STALL:
            continue
        rose = change > TASK_STALL
        out[source] = Finding(
            "task-stalls", "medium" if rose else "low",
            {"task": source, "change": change, "others": falling, "shares": shares,
             "figure": f"{label} loss"},
            f"task {source!r}: its {label} loss {'rose' if rose else 'stalled'} "
            f"({change:+.0%}, last third of the windows against the first) while "
            f"others fell ({fell})",
            [f"if {source!r} is not at its best yet, give it a larger share of the mixture "
             "(its Source weight, or a higher temperature) and compare its evaluation",
             f"a loss that rises as the others fall can mean their gradients pull "
             f"against {source!r}'s (or, with few samples of it, that it learns them by "
             "heart): try a larger share, a head of its own, or fewer shared layers"])
    return out
