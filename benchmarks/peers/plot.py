"""A standalone SVG of each contender's evaluation curve against wall time since the start
of training, drawn with tandem's own chart helpers (``tandem.analyze.report.svg``)."""

from __future__ import annotations

from html import escape
from typing import Any

from recipe import Recipe

from tandem.analyze.report import svg

STYLE = (".grid{stroke:#eef0f3}.axis{stroke:#98a2b3}.tick{fill:#667085;font-size:10.5px}"
         ".label{fill:#475467;font-size:11.5px}.series{fill:none;stroke-width:1.6;"
         "stroke-linejoin:round}.title{fill:#101828;font-size:13px;font-weight:600}"
         "text{font-family:system-ui,sans-serif}")
TOP = 46  # room for the title and the legend


def curves(task: str, runs: list[dict[str, Any]], r: Recipe, labels: dict[str, str]) -> str:
    """The SVG document: one line per run (one colour per contender), targets dashed."""
    names = list(dict.fromkeys(run["contender"] for run in runs))
    colour = {name: svg.PALETTE[i % len(svg.PALETTE)] for i, name in enumerate(names)}
    accuracy = r.targets[0].metric == "accuracy"
    lines, right = [], 0.0
    for run in runs:
        fig = run.get("figures")
        if not fig:
            continue
        xs = fig["curve"]["s"]
        ys = [1.0 - a for a in fig["curve"]["accuracy"]] if accuracy else fig["curve"]["loss"]
        right = max(right, xs[-1])
        lines.append(svg.Line(f"{labels[run['contender']]} r{run['repeat']}", xs, ys,
                              colour[run["contender"]]))
    for t in r.targets:
        y = 1.0 - t.value if accuracy else t.value
        lines.append(svg.Line(f"target {t.label()}", [0.0, right or 1.0], [y, y], "#98a2b3",
                              dashed=True))
    x_label = "seconds since the start of training (evaluations included)"
    chart = svg.line_chart(lines, task, x_label=x_label, log_y=accuracy)
    chart = chart.replace("<svg ", f'<svg x="0" y="{TOP}" width="{svg.WIDTH}" '
                          f'height="{svg.HEIGHT}" ', 1)
    what = "test error (1 - accuracy), log scale" if accuracy else "validation loss (nats)"
    title = f"{task}: {what}, per contender and repeat; dashed: targets"
    legend, x = [], 8.0
    for name in names:
        legend.append(f'<rect x="{x:.0f}" y="30" width="10" height="10" fill="{colour[name]}"/>'
                      f'<text class="tick" x="{x + 14:.0f}" y="39">{escape(labels[name])}</text>')
        x += 24 + 6.2 * len(labels[name])
    height = TOP + svg.HEIGHT
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {svg.WIDTH} {height}" '
            f'width="{svg.WIDTH}" height="{height}"><style>{STYLE}</style>'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text class="title" x="8" y="18">{escape(title)}</text>{"".join(legend)}'
            f"{chart}</svg>\n")
