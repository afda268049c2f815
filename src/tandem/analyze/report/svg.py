"""Small inline-SVG charts: lines with event marks, stacked bars, a heatmap, a scatter.

Hand-written so a report is one self-contained file of a few hundred KiB that opens
offline; each chart carries its plot area in data-* attributes so the page's script
can map the pointer back to a step for its hover read-out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

# Observable's categorical palette: distinct and readable on white.
PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2",
           "#97bbf5", "#9c6b4e", "#9498a0")
WIDTH, HEIGHT = 640, 250
PAD_L, PAD_R, PAD_T, PAD_B = 58, 14, 12, 34
MAX_POINTS = 1500  # polyline points drawn per series; the JSON keeps every point
MAX_COLUMNS = 240  # heatmap / bar columns drawn; more windows are averaged together

Points = list[tuple[float, float]]


@dataclass
class Line:
    """One series of a line chart."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str = ""
    dashed: bool = False


@dataclass
class Mark:
    """A vertical marker at x (an event), labelled by its tooltip."""

    x: float
    label: str
    color: str = "#d03b3b"


def fmt(v: float) -> str:
    """A short human number: 1.2k, 3.4M, 0.0123, 5e-05."""
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About `count` round tick values (1, 2, 5 x 10^k steps) covering lo..hi."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _log_ticks(lo: float, hi: float) -> list[float]:
    ticks = [10.0 ** k for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)]
    inside = [t for t in ticks if lo <= t <= hi]
    if len(inside) >= 3:
        return inside
    fine = [m * t for t in ticks for m in (1, 2, 5)]
    return [t for t in fine if lo <= t <= hi] or [lo, hi]


class _Scale:
    """Maps data to viewBox coordinates over [lo, hi] (log10 when `log`)."""

    def __init__(self, lo: float, hi: float, px0: float, px1: float, log: bool = False):
        self.log = log
        f = math.log10 if log else float
        self.lo, self.hi = f(lo), f(hi)
        if self.hi == self.lo:
            self.lo, self.hi = self.lo - 0.5, self.hi + 0.5
        self.px0, self.px1 = px0, px1

    def __call__(self, v: float) -> float:
        u = math.log10(v) if self.log else v
        return self.px0 + (u - self.lo) / (self.hi - self.lo) * (self.px1 - self.px0)


def _decimate(points: Points) -> Points:
    """Keep each bucket's first, min and max point so spikes survive thinning."""
    if len(points) <= MAX_POINTS:
        return points
    size = math.ceil(len(points) / (MAX_POINTS // 3))
    out: Points = []
    for i in range(0, len(points), size):
        bucket = points[i:i + size]
        keep = {0, min(range(len(bucket)), key=lambda j: bucket[j][1]),
                max(range(len(bucket)), key=lambda j: bucket[j][1])}
        out.extend(bucket[j] for j in sorted(keep))
    return out


def _segments(xs: Sequence[float], ys: Sequence[float], log: bool) -> list[Points]:
    """Runs of plottable points; a NaN (or a non-positive value on a log axis) breaks it."""
    runs: list[Points] = [[]]
    for x, y in zip(xs, ys, strict=True):
        if y is None or not math.isfinite(y) or (log and y <= 0):
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((float(x), float(y)))
    return [r for r in runs if r]


def _frame(x: _Scale, y: _Scale, x_ticks: list[float], y_ticks: list[float],
           x_label: str, y_fmt: Callable[[float], str]) -> list[str]:
    out = []
    for t in y_ticks:
        py = y(t)
        out.append(f'<line class="grid" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{py:.1f}" '
                   f'y2="{py:.1f}"/><text class="tick" x="{PAD_L - 6}" y="{py + 3.5:.1f}" '
                   f'text-anchor="end">{escape(y_fmt(t))}</text>')
    base = HEIGHT - PAD_B
    for t in x_ticks:
        px = x(t)
        out.append(f'<line class="axis" x1="{px:.1f}" x2="{px:.1f}" y1="{base}" '
                   f'y2="{base + 4}"/><text class="tick" x="{px:.1f}" y="{base + 16}" '
                   f'text-anchor="middle">{escape(fmt(t))}</text>')
    out.append(f'<line class="axis" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{base}" y2="{base}"/>')
    out.append(f'<text class="label" x="{(PAD_L + WIDTH - PAD_R) / 2}" y="{HEIGHT - 4}" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    return out


def _open(data_id: str, x: _Scale, label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
            f'aria-label="{escape(label)}" data-src="{escape(data_id)}" '
            f'data-x0="{x.lo}" data-x1="{x.hi}" data-px0="{x.px0}" data-px1="{x.px1}" '
            f'data-top="{PAD_T}" data-bottom="{HEIGHT - PAD_B}">')


def colored(lines: Sequence[Line]) -> list[Line]:
    """The lines, each given a palette color unless it has one."""
    return [Line(ln.name, ln.xs, ln.ys, ln.color or PALETTE[i % len(PALETTE)], ln.dashed)
            for i, ln in enumerate(lines)]


def line_chart(lines: Sequence[Line], data_id: str, *, x_label: str = "step",
               marks: Sequence[Mark] = (), log_y: bool = False, y_min: float | None = None,
               binary: bool = False, y_fmt: Callable[[float], str] = fmt) -> str:
    """An SVG line chart of `lines` (colored already) with vertical `marks`; `binary`
    puts y ticks on round powers of 1024 (sizes in bytes)."""
    pts = [(x, y) for ln in lines for seg in _segments(ln.xs, ln.ys, log_y) for x, y in seg]
    if not pts:
        return '<p class="empty">no values recorded</p>'
    xs = [p[0] for p in pts] + [m.x for m in marks]
    ys = [p[1] for p in pts]
    lo_y = min(ys) if y_min is None else min(y_min, min(ys))
    hi_y = max(ys)
    if not log_y:
        pad = (hi_y - lo_y) * 0.05 or abs(hi_y) * 0.05 or 1.0
        lo_y, hi_y = (lo_y if y_min is not None else lo_y - pad), hi_y + pad
    x = _Scale(min(xs), max(xs), PAD_L, WIDTH - PAD_R)
    y = _Scale(lo_y, hi_y, HEIGHT - PAD_B, PAD_T, log=log_y)
    if log_y:
        y_ticks = _log_ticks(lo_y, hi_y)
    elif binary:
        # Round numbers of GiB / MiB rather than of bytes (18.6 GiB is no tick).
        unit = next(u for u in (2.0 ** 40, 2.0 ** 30, 2.0 ** 20, 2.0 ** 10, 1.0)
                    if hi_y >= u or u == 1.0)
        y_ticks = [t * unit for t in nice_ticks(lo_y / unit, hi_y / unit)]
    else:
        y_ticks = nice_ticks(lo_y, hi_y)
    out = [_open(data_id, x, data_id)]
    out += _frame(x, y, nice_ticks(min(xs), max(xs), 6), y_ticks, x_label, y_fmt)
    for m in marks:
        px = x(m.x)
        out.append(f'<line class="mark" x1="{px:.1f}" x2="{px:.1f}" y1="{PAD_T}" '
                   f'y2="{HEIGHT - PAD_B}" stroke="{m.color}"><title>{escape(m.label)}</title>'
                   f'</line><circle cx="{px:.1f}" cy="{PAD_T + 3}" r="3.5" fill="{m.color}">'
                   f'<title>{escape(m.label)}</title></circle>')
    for ln in lines:
        dash = ' stroke-dasharray="5 4"' if ln.dashed else ""
        for seg in _segments(ln.xs, ln.ys, log_y):
            if len(seg) == 1:
                out.append(f'<circle cx="{x(seg[0][0]):.1f}" cy="{y(seg[0][1]):.1f}" r="2.5" '
                           f'fill="{ln.color}"/>')
                continue
            path = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in _decimate(seg))
            out.append(f'<polyline class="series" points="{path}" stroke="{ln.color}"{dash}/>')
    out.append("</svg>")
    return "".join(out)


@dataclass
class Dot:
    """One point of a scatter, labelled by its tooltip; `ring` draws it hollow and larger
    (the chosen one)."""

    x: float
    y: float
    label: str
    color: str = PALETTE[0]
    ring: bool = False


def scatter(dots: Sequence[Dot], data_id: str, *, x_label: str, y_label: str,
            log_x: bool = False, level: float | None = None, level_label: str = "") -> str:
    """An SVG scatter of `dots` (each with its label beside it), with an optional dashed
    horizontal `level` (a budget's bound)."""
    dots = [d for d in dots if math.isfinite(d.x) and math.isfinite(d.y)
            and (d.x > 0 or not log_x)]
    if not dots:
        return '<p class="empty">no points</p>'
    xs, ys = [d.x for d in dots], [d.y for d in dots] + ([level] if level is not None else [])
    pad = (max(ys) - min(ys)) * 0.08 or abs(max(ys)) * 0.05 or 1.0
    x_lo, x_hi = min(xs), max(xs)
    if not log_x:
        x_pad = (x_hi - x_lo) * 0.08 or abs(x_hi) * 0.05 or 1.0
        x_lo, x_hi = x_lo - x_pad, x_hi + x_pad
    else:
        x_lo, x_hi = x_lo / 1.3, x_hi * 1.3
    x = _Scale(x_lo, x_hi, PAD_L, WIDTH - PAD_R, log=log_x)
    y = _Scale(min(ys) - pad, max(ys) + pad, HEIGHT - PAD_B, PAD_T)
    x_ticks = _log_ticks(x_lo, x_hi) if log_x else nice_ticks(x_lo, x_hi, 6)
    out = [_open(data_id, x, f"{y_label} against {x_label}")]
    out += _frame(x, y, x_ticks, nice_ticks(min(ys) - pad, max(ys) + pad), x_label, fmt)
    out.append(f'<text class="label" x="{PAD_L + 4}" y="{PAD_T + 10}">{escape(y_label)}'
               "</text>")
    if level is not None:
        py = y(level)
        out.append(f'<line class="mark" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{py:.1f}" '
                   f'y2="{py:.1f}" stroke="#d03b3b" stroke-dasharray="5 4"><title>'
                   f'{escape(level_label)}</title></line>')
    for d in dots:
        px, py = x(d.x), y(d.y)
        shape = (f'<circle class="dot chosen" cx="{px:.1f}" cy="{py:.1f}" r="7" fill="none" '
                 f'stroke="{d.color}" stroke-width="2.5">' if d.ring else
                 f'<circle class="dot" cx="{px:.1f}" cy="{py:.1f}" r="4" fill="{d.color}">')
        out.append(f"{shape}<title>{escape(d.label)}</title></circle>"
                   f'<text class="tick" x="{px + 8:.1f}" y="{py - 6:.1f}">{escape(d.label)}'
                   "</text>")
    out.append("</svg>")
    return "".join(out)


def stacked_bars(xs: Sequence[float], layers: Sequence[Line], data_id: str, *,
                 x_label: str = "step", y_fmt: Callable[[float], str] = fmt) -> str:
    """Stacked bars, one per x, of `layers` (colored already); NaN counts as 0."""
    if not xs or not layers:
        return '<p class="empty">no values recorded</p>'
    cols = _columns(list(xs), [list(ln.ys) for ln in layers])
    tops = [sum(v for v in col_vals) for _, col_vals in cols]
    x = _Scale(cols[0][0][0], cols[-1][0][-1], PAD_L, WIDTH - PAD_R)
    y = _Scale(0.0, max(tops) * 1.05 or 1.0, HEIGHT - PAD_B, PAD_T)
    out = [_open(data_id, x, data_id)]
    out += _frame(x, y, nice_ticks(x.lo, x.hi, 6), nice_ticks(0.0, y.hi), x_label, y_fmt)
    slot = (WIDTH - PAD_L - PAD_R) / len(cols)
    gap = 1.0 if slot > 4 else 0.0
    # Touching bars overlap a little so anti-aliasing leaves no hairline between them.
    bar_w = slot - gap if gap else slot + 0.4
    for i, (span, values) in enumerate(cols):
        left = PAD_L + i * slot
        bottom = 0.0
        tip = f"step {fmt(span[0])}" + (f"-{fmt(span[-1])}" if len(span) > 1 else "")
        for ln, v in zip(layers, values, strict=True):
            if v <= 0:
                continue
            y0, y1 = y(bottom), y(bottom + v)
            out.append(f'<rect x="{left + gap / 2:.2f}" y="{y1:.2f}" width="{bar_w:.2f}" '
                       f'height="{max(0.0, y0 - y1):.2f}" fill="{ln.color}"><title>{tip}: '
                       f'{escape(ln.name)} {escape(y_fmt(v))}</title></rect>')
            bottom += v
    out.append("</svg>")
    return "".join(out)


def _columns(xs: list[float], rows: list[list[float]],
             empty: float = 0.0) -> list[tuple[list[float], list[float]]]:
    """Group x positions into at most MAX_COLUMNS columns, averaging each row's finite
    values (`empty` where a column has none)."""
    size = max(1, math.ceil(len(xs) / MAX_COLUMNS))
    out = []
    for i in range(0, len(xs), size):
        span = xs[i:i + size]
        values = []
        for row in rows:
            good = [v for v in row[i:i + size] if v is not None and math.isfinite(v)]
            values.append(sum(good) / len(good) if good else empty)
        out.append((span, values))
    return out


def heat_color(score: float, centre: float = 1.0, span: float = 0.5) -> str:
    """White at `centre`, shading to red above and to blue below (saturating at +-span)."""
    if not math.isfinite(score):
        return "#e0e0e0"
    t = max(-1.0, min(1.0, (score - centre) / span))
    hot, cold = (214, 39, 40), (66, 105, 208)
    end = hot if t > 0 else cold
    mix = [round(255 + (c - 255) * abs(t)) for c in end]
    return "#{:02x}{:02x}{:02x}".format(*mix)


def heatmap(row_labels: Sequence[str], xs: Sequence[float], values: Sequence[Sequence[float]],
            data_id: str, *, cell_title: Callable[[int, float, float, float], str],
            x_label: str = "step") -> str:
    """A rows x windows grid colored by `heat_color`; columns are averaged past
    MAX_COLUMNS windows and `cell_title(row, first_x, last_x, value)` labels each cell."""
    if not xs or not row_labels:
        return '<p class="empty">no per-rank values recorded</p>'
    cols = _columns(list(xs), [list(r) for r in values], empty=math.nan)
    row_h = max(6.0, min(26.0, 180.0 / len(row_labels)))
    height = PAD_T + row_h * len(row_labels) + PAD_B
    x = _Scale(0, len(cols), PAD_L, WIDTH - PAD_R)
    slot = (WIDTH - PAD_L - PAD_R) / len(cols)
    out = [f'<svg class="chart heat" viewBox="0 0 {WIDTH} {height:.0f}" role="img" '
           f'aria-label="{escape(data_id)}">']
    for r, label in enumerate(row_labels):
        top = PAD_T + r * row_h
        if len(row_labels) <= 32 or r % math.ceil(len(row_labels) / 32) == 0:
            out.append(f'<text class="tick" x="{PAD_L - 6}" y="{top + row_h / 2 + 3.5:.1f}" '
                       f'text-anchor="end">{escape(label)}</text>')
        for c, (span, col_vals) in enumerate(cols):
            v = col_vals[r]
            out.append(f'<rect x="{x(c):.2f}" y="{top:.2f}" width="{slot + 0.4:.2f}" '
                       f'height="{row_h - 1:.2f}" fill="{heat_color(v)}"><title>'
                       f'{escape(cell_title(r, span[0], span[-1], v))}</title></rect>')
    base = PAD_T + row_h * len(row_labels)
    starts = [span[0] for span, _ in cols]
    # At the columns whose first steps are nearest round tick values.
    nearest = {min(range(len(cols)), key=lambda j: abs(starts[j] - t))
               for t in nice_ticks(starts[0], starts[-1], 5)}
    for i in sorted(nearest):
        out.append(f'<text class="tick" x="{x(i) + slot / 2:.1f}" y="{base + 14:.1f}" '
                   f'text-anchor="middle">{escape(fmt(starts[i]))}</text>')
    out.append(f'<text class="label" x="{(PAD_L + WIDTH - PAD_R) / 2}" y="{height - 4:.0f}" '
               f'text-anchor="middle">{escape(x_label)}</text></svg>')
    return "".join(out)


def legend(lines: Sequence[Line]) -> str:
    """An HTML legend (wraps with the page) for colored lines."""
    items = "".join(
        f'<span class="key"><i style="background:{ln.color}"></i>{escape(ln.name)}</span>'
        for ln in lines)
    return f'<div class="legend">{items}</div>'
