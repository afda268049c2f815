"""Report panels: a chart, its legend and its embedded data, from metric rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tandem.analyze import text
from tandem.analyze.diagnosis.find_health import (
    UNSTABLE_EVENT_KINDS,
    event_kind,
    small_outlier,
    start_levels,
)
from tandem.analyze.report import figures, html, svg
from tandem.analyze.report.figures import PHASES, Metric
from tandem.monitor.catalogue import (
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    MEM_RSS,
    PP_BUBBLE,
    PP_BUBBLE_PREDICTED,
    SAMPLES_PER_S,
    TASK_EVAL_LOSS,
    TASK_LOSS,
    TASK_SHARE,
    TIME_STEP,
    TOKENS_PER_S,
    UPDATE_RATIO,
    task_kind,
)

Groups = Mapping[str, Sequence[Metric]]

PHASE_COLORS = ("#efb118", "#97bbf5", "#4269d0", "#ff725c", "#3ca951", "#d0d5dd")


def _payload(title: str, lines: Sequence[svg.Line], unit: str) -> dict[str, Any]:
    return {"title": title, "x_label": "step", "unit": unit,
            "series": [{"name": ln.name, "x": list(ln.xs), "y": list(ln.ys), "color": ln.color}
                       for ln in lines]}


def line_panel(title: str, data_id: str, lines: Sequence[svg.Line], *, note: str = "",
               unit: str = "", marks: Sequence[svg.Mark] = (),
               extra: Mapping[str, Any] | None = None,
               y_fmt: Callable[[float], str] = svg.fmt) -> str:
    """A card with a line chart of `lines` and its data block `data_id`.

    The data block holds every point as recorded (the chart may thin long series).
    """
    lines = svg.colored([ln for ln in lines if ln.xs])
    if not lines:
        return ""
    ys = [y for ln in lines for y in ln.ys if y is not None and math.isfinite(y)]
    # Curves that fall over decades (a loss from 10 to 0.01) read better on a log axis.
    log_y = bool(ys) and min(ys) > 0 and max(ys) / min(ys) > 30 and unit != "bytes"
    payload = _payload(title, lines, unit)
    payload.update(extra or {})
    chart = svg.line_chart(lines, data_id, marks=marks, log_y=log_y, y_fmt=y_fmt,
                           binary=unit == "bytes")
    if log_y:
        note = (note + " " if note else "") + "(log scale)"
    return html.card(title, svg.legend(lines) + chart + html.data_block(data_id, payload), note)


def _event_color(kind: str, small: bool = False) -> str:
    """Red for what the health finding counts as instability; an outlier that is small
    on the run's own scale (`find_health.small_outlier`) is grey, as the finding says."""
    if event_kind(kind) in UNSTABLE_EVENT_KINDS and not small:
        return "#d92d20"
    return "#dc6803" if kind in ("resume", "restart", "preempted") else "#667085"


def loss_panel(groups: Groups, events: Sequence[Mapping[str, Any]]) -> str:
    """Training loss, evaluation losses, and events marked where they happened."""
    names = [LOSS] + [n for n in figures.eval_names(groups) if n.endswith("loss")]
    lines = [svg.Line(n, *figures.series_of(groups, n), dashed=n != LOSS) for n in names]
    shown = [e for e in events if e["step"] >= 0]
    loss0, grad0 = start_levels(groups)
    small = [small_outlier(e, loss0, grad0) for e in shown]
    marks = [svg.Mark(e["step"], f"step {e['step']}: {e['kind']}"
                      f"{' (small on this run: not instability)' if tiny else ''}"
                      f" - {e['message']}", _event_color(str(e["kind"]), tiny))
             for e, tiny in zip(shown, small, strict=True)]
    extra = {"events": [{"step": e["step"], "rank": e["rank"], "kind": e["kind"],
                         "message": e["message"]} for e in shown]}
    return line_panel("Loss", "data-loss", lines, marks=marks, extra=extra,
                      note="markers: events (hover for details)" if marks else "")


def eval_panel(groups: Groups) -> str:
    """Evaluation and user metrics other than losses."""
    names = [n for n in figures.eval_names(groups) if not n.endswith("loss")]
    lines = [svg.Line(n, *figures.series_of(groups, n)) for n in names]
    return line_panel("Evaluation metrics", "data-eval", lines)


def task_panels(groups: Groups) -> list[str]:
    """A mixture's sources: each one's training and evaluation loss, and its own
    evaluation metrics, one colour per source."""
    names = figures.task_names(groups)
    sources = sorted({source for source, _ in names.values()})
    losses = {task_kind(TASK_LOSS): False, task_kind(TASK_EVAL_LOSS): True}  # dashed
    loss_lines, metric_lines = [], []
    for name, (source, what) in names.items():
        color = svg.PALETTE[sources.index(source) % len(svg.PALETTE)]
        line = svg.Line(f"{source} {what}", *figures.series_of(groups, name), color,
                        dashed=losses.get(what, False))
        if what in losses:
            loss_lines.append(line)
        elif what != task_kind(TASK_SHARE):
            metric_lines.append(line)
    return [line_panel("Loss by task", "data-task-loss", loss_lines,
                       note="solid: training (window mean); dashed: evaluation"),
            line_panel("Evaluation metrics by task", "data-task-metrics", metric_lines)]


def throughput_panels(groups: Groups) -> list[str]:
    """Samples per second and, when recorded, tokens per second."""
    out = []
    for name, title, data_id in ((SAMPLES_PER_S, "Throughput (samples/s)", "data-throughput"),
                                 (TOKENS_PER_S, "Throughput (tokens/s)", "data-tokens")):
        steps, values = figures.series_of(groups, name)
        if steps:
            out.append(line_panel(title, data_id, [svg.Line(name, steps, values)],
                                  note="per logging window"))
    return out


def optimizer_panels(groups: Groups) -> list[str]:
    """Gradient norm, update/weight ratio, learning rate and fp16 loss scale."""
    out = []
    for name, title in ((GRAD_NORM, "Gradient norm"),
                        (UPDATE_RATIO, "Update / weight norm (one step per window)"),
                        (LR, "Learning rate"), (LOSS_SCALE, "fp16 loss scale")):
        steps, values = figures.series_of(groups, name)
        if steps:
            out.append(line_panel(title, f"data-{name}", [svg.Line(name, steps, values)]))
    return out


def phases_panel(groups: Groups) -> str:
    """Stacked mean phase times per logging window, plus the unaccounted rest."""
    step_steps, step_values = figures.series_of(groups, TIME_STEP)
    at = {name: dict(zip(*figures.series_of(groups, name), strict=True)) for name, _ in PHASES}
    recorded = [(name, label) for name, label in PHASES if at[name]]
    if not step_steps or not recorded:
        return ""
    layers = []
    for (name, label), color in zip(recorded, PHASE_COLORS, strict=False):
        layers.append(svg.Line(label, step_steps, [at[name].get(s, math.nan) for s in step_steps],
                               color))
    rest = []
    for i, total in enumerate(step_values):
        parts = [ln.ys[i] for ln in layers if math.isfinite(ln.ys[i])]
        rest.append(max(0.0, total - sum(parts)) if math.isfinite(total) else math.nan)
    layers.append(svg.Line("other", step_steps, rest, PHASE_COLORS[-1]))
    chart = svg.stacked_bars(step_steps, layers, "data-phases", y_fmt=text.seconds)
    payload = _payload("Step time breakdown", layers, "s")
    payload["step"] = {"x": step_steps, "y": step_values}
    payload["names"] = [name for name, _ in recorded] + ["other"]
    return html.card("Step time breakdown", svg.legend(layers) + chart
                     + html.data_block("data-phases", payload),
                     "seconds per step, mean of each logging window; other = step time "
                     "not in a measured phase")


def memory_panel(groups: Groups) -> str:
    """Host RSS and CUDA peak memory (the largest over ranks), and the device total."""
    lines = []
    for name, label, dashed in ((MEM_RSS, "host RSS", False),
                                (MEM_CUDA_PEAK, "CUDA peak", False),
                                (MEM_CUDA_TOTAL, "CUDA total", True)):
        steps, values = figures.series(groups.get(name, ()), reduce=max)
        if steps:
            lines.append(svg.Line(label, steps, values, dashed=dashed))
    return line_panel("Memory", "data-memory", lines, unit="bytes", y_fmt=text.nbytes,
                      note="largest over ranks in each window")


def pipeline_panel(groups: Groups) -> str:
    """Each pipeline rank's idle share per window, measured and as the schedule's action
    table predicts it from the stages' measured costs (dashed)."""
    measured = figures.per_rank(groups.get(PP_BUBBLE, ()))
    predicted = figures.per_rank(groups.get(PP_BUBBLE_PREDICTED, ()))
    lines = []
    for rank in sorted(measured):
        for by_step, label, dashed in ((measured, "measured", False),
                                       (predicted, "predicted", True)):
            steps = sorted(by_step.get(rank, {}))
            if steps:
                lines.append(svg.Line(f"rank {rank} {label}", steps,
                                      [by_step[rank][s] for s in steps], dashed=dashed))
    return line_panel("Pipeline bubble", "data-pipeline", lines, unit="fraction",
                      note="share of each step a rank's stages were idle; dashed: the "
                           "schedule's prediction at the measured stage costs")


def ranks_panel(groups: Groups) -> str:
    """Heatmap of each rank's step time relative to the median rank, per window."""
    scores = figures.straggler_scores(groups)
    if not scores:
        return ""
    ranks = sorted(scores)
    steps = sorted({s for by_step in scores.values() for s in by_step})
    grid = [[scores[r].get(s, math.nan) for s in steps] for r in ranks]
    times = figures.per_rank(groups.get(TIME_STEP, ()))

    def title(row: int, first: float, last: float, value: float) -> str:
        span = f"step {first:g}" if first == last else f"steps {first:g}-{last:g}"
        t = times.get(ranks[row], {}).get(int(first))
        extra = f", {text.seconds(t)} per step" if t is not None and first == last else ""
        return f"rank {ranks[row]}, {span}: {value:.3f}x median{extra}"

    chart = svg.heatmap([f"rank {r}" for r in ranks], steps, grid, "data-ranks",
                        cell_title=title)
    payload = {"title": "Step time by rank", "ranks": ranks, "steps": steps, "score": grid,
               "step_s": [[times.get(r, {}).get(s) for s in steps] for r in ranks]}
    scale = '<div class="scale">0.5x<i></i>1.5x of the median rank</div>'
    return html.card("Step time by rank", scale + chart + html.data_block("data-ranks", payload),
                     "each rank's step time over the median rank's, per logging window; "
                     "red = slower")
