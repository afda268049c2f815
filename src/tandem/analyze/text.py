"""Numbers as short text for reports and terminals."""

from __future__ import annotations

import datetime as dt
import math

from tandem.analyze.report.svg import fmt

DASH = "-"


def number(v: float | None) -> str:
    """A short number (1.2k, 0.0123), or a dash when missing."""
    return DASH if v is None else fmt(v)


def seconds(v: float | None) -> str:
    """A duration: 12 ms, 3.4 s, 5m 06s, 2h 03m."""
    if v is None or not math.isfinite(v):
        return DASH
    if v < 1:
        return f"{v * 1000:.3g} ms"
    if v < 60:
        return f"{v:.3g} s"
    if v < 3600:
        return f"{int(v // 60)}m {int(v % 60):02d}s"
    return f"{int(v // 3600)}h {int(v % 3600 // 60):02d}m"


def nbytes(v: float | None) -> str:
    """A size in binary units: 512 MiB, 12.3 GiB."""
    if v is None or not math.isfinite(v):
        return DASH
    for unit, size in (("TiB", 2.0 ** 40), ("GiB", 2.0 ** 30), ("MiB", 2.0 ** 20),
                       ("KiB", 2.0 ** 10)):
        if abs(v) >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.0f} B"


def share(v: float | None) -> str:
    """A fraction as a percentage."""
    return DASH if v is None or not math.isfinite(v) else f"{v:.0%}"


def when(epoch: float | None) -> str:
    """A local date and time, to the second."""
    if epoch is None:
        return DASH
    return dt.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")
