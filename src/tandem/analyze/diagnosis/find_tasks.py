"""Joint training: a source of a mixture whose training loss stalls or rises while
another's falls.

Each source's `task/NAME/loss` windows are split in thirds; a source's change is the
median of the last third over the median of the first, less one. A source that fell by
less than TASK_STALL (2%), or rose, while another fell by at least TASK_FALL (10%), is
named: it gains nothing from the steps the mixture gives it (converged, starved by its
share, or pulled the other way by the other tasks' gradients). Its evidence holds every
source's share of the last window, from which the tuner proposes others (`tune/mixing`).
"""

from __future__ import annotations

import statistics

from tandem.analyze import stats
from tandem.analyze.diagnosis.finding import Context, Finding
from tandem.analyze.report.figures import series_of, task_names
from tandem.monitor.catalogue import TASK_LOSS, TASK_SHARE, task_kind

TASK_STALL = 0.02
TASK_FALL = 0.10
TASK_MIN_WINDOWS = 6


def _change(values: list[float]) -> float | None:
    """Median of the last third over the median of the first third, less one."""
    finite = stats.finite(values)
    if len(finite) < TASK_MIN_WINDOWS:
        return None
    third = len(finite) // 3
    first, last = statistics.median(finite[:third]), statistics.median(finite[-third:])
    return last / first - 1 if first > 0 else None


def task_stalls(ctx: Context) -> list[Finding]:
    """One finding per source whose loss stalled or rose while another's fell."""
    changes: dict[str, float] = {}
    shares: dict[str, float] = {}  # each source's share of the last window
    for name, (source, what) in task_names(ctx.groups).items():
        values = series_of(ctx.groups, name)[1]
        if what == task_kind(TASK_LOSS):
            change = _change(values)
            if change is not None:
                changes[source] = change
        elif what == task_kind(TASK_SHARE) and values:
            shares[source] = values[-1]
    falling = {s: c for s, c in changes.items() if c <= -TASK_FALL}
    if not falling:
        return []
    fell = ", ".join(f"{s} {c:+.0%}" for s, c in sorted(falling.items()))
    out = []
    for source, change in sorted(changes.items()):
        if change <= -TASK_STALL:
            continue
        rose = change > TASK_STALL
        out.append(Finding(
            "task-stalls", "medium" if rose else "low",
            {"task": source, "change": change, "others": falling, "shares": shares},
            f"task {source!r}: its training loss {'rose' if rose else 'stalled'} "
            f"({change:+.0%}, last third of the windows against the first) while "
            f"others fell ({fell})",
            [f"if {source!r} is not at its best yet, give it a larger share of the mixture "
             "(its Source weight, or a higher temperature) and compare its evaluation",
             f"a loss that rises as the others fall can mean their gradients pull "
             f"against {source!r}'s: try a head of its own, or fewer shared layers"]))
    return out
