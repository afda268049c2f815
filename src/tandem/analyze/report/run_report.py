"""One run's report: a self-contained HTML file, and a summary for the terminal."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tandem.analyze import text
from tandem.analyze.diagnosis.diagnose import Finding, diagnose_run, verdict
from tandem.analyze.diagnosis.finding import VALIDATION_PREFIX, with_validations
from tandem.analyze.report import figures, html, panels
from tandem.analyze.report.compare import compare, compare_table
from tandem.analyze.report.compression import COMPRESS_PREFIX, tradeoff_html
from tandem.monitor.catalogue import TIME_STEP
from tandem.monitor.store import RunStore
from tandem.status import RunStatus
from tandem.tables import print_fitted

__all__ = ["compare", "compare_table", "print_summary", "render_html", "write_html"]

SEVERITY_STYLE = {"high": "bold red", "medium": "bold yellow", "low": "bold blue",
                  "info": "bold green"}


def _load(store: RunStore, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                 list[dict[str, Any]], list[Finding]]:
    run = store.run(run_id)
    metrics = store.metrics(run["run_id"])
    events = store.events(run["run_id"])
    findings = diagnose_run(run, metrics, events)
    return run, metrics, events, with_validations(findings, store.trials(run["run_id"]))


def findings_of(store: RunStore, run_id: str) -> list[Finding]:
    """Run `run_id`'s diagnosis, with the control experiments recorded for it."""
    return _load(store, run_id)[3]


def _kpi_items(run: Mapping[str, Any], head: Mapping[str, Any]) -> list[tuple[str, str]]:
    duration = head["duration_s"]
    if duration is None:
        duration = time.time() - run["started"]
    summary = run.get("summary") or {}
    # Training time alone hides what came before the first step (reading data into
    # memory, building, compiling): the process's whole time is shown beside it.
    items = [("steps", f"{head['steps']:,}"), ("training time", text.seconds(duration)),
             ("end to end", text.seconds(summary.get("end_to_end_s"))),
             ("of which start-up", text.seconds(summary.get("startup_s"))),
             ("data loading (in memory)", text.seconds(summary.get("data_load_s"))),
             ("final loss", text.number(head["final_loss"]))]
    evals = [k for k in head if k not in figures.HEADLINE_KEYS]
    items += [(name, text.number(head[name])) for name in evals[:3]]
    items += [("samples/s", text.number(head["samples_per_s"])),
              ("tokens/s", text.number(head["tokens_per_s"])),
              ("step time", text.seconds(head["step_s"])),
              ("MFU", text.share(head["mfu"])),
              ("grad noise scale", text.number(head["grad_noise_scale"])),
              ("CUDA peak", text.nbytes(head["cuda_peak_bytes"])),
              ("host RSS", text.nbytes(head["rss_peak_bytes"]))]
    return [(label, value) for label, value in items if value != text.DASH]


def _suggestion(s: str) -> str:
    # "data.workers 2 -> 4: why" -> the config change as code, then the reason.
    m = re.match(r"^([a-z_]+\.[a-z_]+[^:]*):(.*)$", s)
    if not m:
        return f"<li>{escape(s)}</li>"
    return f"<li><code>{escape(m.group(1))}</code>{escape(m.group(2))}</li>"


def validation_text(f: Finding) -> str:
    """What the finding's control experiment said, or how to run it."""
    v = f.validation
    if v is None:
        if f.predicted_speedup is None:
            return ""
        if f.control is None:
            return (f"predicts {f.predicted_speedup:.2f}x if removed; no control experiment "
                    "exists for this cause")
        return (f"predicts {f.predicted_speedup:.2f}x if removed; not validated "
                "(tandem report RUN --validate runs its control experiment)")
    low, high = (v.get("interval") or [None, None])[:2]
    spread = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    # The controls compare step throughput (tune/controls.py): what a cause costs each
    # step, not what removing it costs up front (reading the data into memory).
    return (f"{v['state']}: predicted {v['predicted']:.2f}x, the control measured "
            f"{v['measured']:.2f}x{spread} over {v.get('runs', '?')} runs (training steps "
            "only, not end to end: start-up and data loading are not counted)")


def findings_html(findings: Sequence[Finding]) -> str:
    """The diagnosis as cards, most severe first; a refuted one says so in its title."""
    if not findings:
        return '<p class="empty">no timing figures recorded: nothing to diagnose</p>'
    out = []
    for f in findings:
        tips = "".join(_suggestion(s) for s in f.suggestions)
        state = (f.validation or {}).get("state")
        title = f"{f.kind} (refuted)" if state == "refuted" else f.kind
        check = validation_text(f)
        out.append(f'<div class="finding {escape(f.severity)}"><h3>{escape(title)}'
                   f"<small>{escape(f.severity)}</small></h3><div>{escape(f.message)}</div>"
                   + (f'<div class="check">{escape(check)}</div>' if check else "")
                   + (f"<ul>{tips}</ul>" if tips else "") + "</div>")
    return "".join(out) + html.data_block("data-findings", {"findings": [
        {"kind": f.kind, "severity": f.severity, "evidence": f.evidence,
         "message": f.message, "suggestions": f.suggestions,
         "predicted_speedup": f.predicted_speedup, "control": f.control,
         "validation": f.validation} for f in findings]})


def _header(run: Mapping[str, Any], findings: Sequence[Finding]) -> str:
    env = run.get("env") or {}
    status = str(run["status"])
    commit = env.get("git_commit")
    bits = [f"run {run['run_id']}", f"started {text.when(run['started'])}",
            f"{env.get('world_size', '?')} x {env.get('device', '?')}",
            f"host {env.get('host', '?')}", f"torch {env.get('torch', '?')}"]
    if commit:
        bits.append(f"commit {str(commit)[:10]}")
    lead = verdict(findings)
    verdict_html = "" if lead is None else (
        f'<div class="verdict {escape(lead.severity)}"><b>verdict: {escape(lead.kind)}</b> '
        f"{escape(lead.message)}</div>")
    return (f"<header><h1>{escape(str(run['name']))}<span class=\"badge s-{escape(status)}\">"
            f"{escape(status)}</span></h1><div class=\"sub\">{escape(' · '.join(bits))}</div>"
            f"{verdict_html}</header>")


# Events that say why a run stopped (`usage` and `preflight`: stores from before refused
# starts were left out of the store).
ENDINGS = ("crash", "usage", "preflight", "interrupted", "preempted")


def ending(run: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The last event saying why a run that did not complete stopped (None: it completed,
    or nothing says)."""
    if run["status"] in (RunStatus.COMPLETED, RunStatus.RUNNING):
        return None
    return next((dict(e) for e in reversed(events) if e["kind"] in ENDINGS), None)


def segments(events: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per attempt of the run (its start step, processes, plan)."""
    return [[str(e["step"]), str(int(e["value"])) if e.get("value") is not None else "?",
             str(e["message"]), text.when(e["time"])]
            for e in events if e["kind"] == "segment"]


def segments_html(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The segments of a resumed run (nothing for a run of one attempt)."""
    rows = segments(events)
    if len(rows) < 2:
        return []
    return ["<h2>Segments</h2>", html.list_table(["from step", "processes", "plan", "started"],
                                                  rows, numeric=[True, True, False, False])]


def _events_table(events: Sequence[Mapping[str, Any]]) -> str:
    rows = [[str(e["step"]), str(e["rank"]), str(e["kind"]), str(e["message"]),
             text.number(e["value"]), text.number(e["threshold"]), text.when(e["time"])]
            for e in events]
    return html.list_table(["step", "rank", "kind", "message", "value", "threshold", "time"],
                           rows, numeric=[True, True, False, False, True, True, False])


def _interval(d: Any, suffix: str = "") -> str:
    if not isinstance(d, Mapping) or "estimate" not in d:
        return ""
    return f"{d['estimate']:.3g}{suffix} [{d['low']:.3g}, {d['high']:.3g}]"


def tuning_trials(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """A tune session's trials (a run's control experiments and compression experiments
    are kept apart)."""
    return [t for t in store.trials(run_id)
            if not str(t["trial_id"]).startswith((VALIDATION_PREFIX, COMPRESS_PREFIX))]


def trial_rows(trials: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The tuner's decision record as table rows: id, trial, status, samples/s, ratio, why."""
    return [[str(t["trial_id"]), str((t.get("figures") or {}).get("label", "")),
             str(t["status"]), _interval((t.get("figures") or {}).get("samples_per_s")),
             _interval((t.get("figures") or {}).get("ratio"), "x"), str(t.get("decision") or "")]
            for t in trials]


def trials_html(trials: Sequence[Mapping[str, Any]]) -> str:
    """The tune session's trials: every run, its figures with 95% intervals, and why."""
    if not trials:
        return ""
    return "<h2>Tuning decisions</h2>" + html.list_table(
        ["#", "trial", "status", "samples/s [95% CI]", "vs plan [95% CI]", "decision"],
        trial_rows(trials), numeric=[True, False, False, True, True, False])


def render_html(store: RunStore, run_id: str) -> str:
    """The report of one run (id, id prefix or name) as an HTML string."""
    run, metrics, events, findings = _load(store, run_id)
    groups = figures.by_name(metrics)
    head = figures.headline(run, metrics)
    charts = [panels.loss_panel(groups, events), panels.eval_panel(groups),
              *panels.task_panels(groups), *panels.throughput_panels(groups),
              panels.phases_panel(groups), panels.ranks_panel(groups),
              panels.pipeline_panel(groups), panels.memory_panel(groups),
              *panels.optimizer_panels(groups)]
    charts = [c for c in charts if c]
    summary = run.get("summary") or {}
    trials = tuning_trials(store, run["run_id"])
    # A tune session records decisions, not training: its trials' runs hold the curves.
    # (A compression experiment's trials are drawn apart, below the training.)
    training = [
        "<h2>Diagnosis</h2>", findings_html(findings),
        "<h2>Curves</h2>",
        f'<div class="grid">{"".join(charts)}</div>' if charts
        else '<p class="empty">no metrics recorded</p>',
        *segments_html(events), _async_html(groups),
        "<h2>Events</h2>", _events_table(events),
    ] if metrics or not trials else []
    body = [
        _header(run, findings), html.kpis(_kpi_items(run, head)),
        trials_html(trials), *training, tradeoff_html(store.trials(run["run_id"])),
        "<h2>Configuration and environment</h2><div class=\"grid\">",
        html.card("Config", html.kv_table(run.get("config") or {})),
        html.card("Plan", html.kv_table(run.get("plan") or {})),
        html.card("Environment", html.kv_table(run.get("env") or {})),
        html.card("Summary", html.kv_table(summary)) if summary else "",
        "</div>",
        html.data_block("data-run", {"run_id": run["run_id"], "name": run["name"],
                                     "status": run["status"], "headline": head}),
        f"<footer>tandem report · {escape(str(store.path))} · generated "
        f"{text.when(time.time())}</footer>",
    ]
    return html.page(f"tandem · {run['name']}", "".join(body))


def _async_html(groups: Mapping[str, Sequence[Any]]) -> str:
    rows = figures.async_workers(groups)
    if not rows:
        return ""
    return "<h2>Asynchronous workers</h2>" + html.list_table(
        figures.ASYNC_HEADER, rows, numeric=[True] * len(figures.ASYNC_HEADER))


def write_html(store: RunStore, run_id: str, path: Path) -> Path:
    """Write the report of one run to `path` (a self-contained HTML file); returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_html(store, run_id), encoding="utf-8")
    # Rename last: a browser refreshing the report never sees half a file.
    tmp.replace(path)
    return path


def print_summary(store: RunStore, run_id: str, console: Console) -> None:
    """The run's key numbers, step-time shares and diagnosis, for the terminal."""
    run, metrics, events, findings = _load(store, run_id)
    head = figures.headline(run, metrics)
    groups = figures.by_name(metrics)
    table = Table(title=f"tandem run {run['name']} ({run['run_id']}) · {run['status']}",
                  show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    for label, value in _kpi_items(run, head):
        table.add_row(label, value)
    step = figures.steady_median(groups, TIME_STEP)
    if step:
        shares = [(label, figures.steady_median(groups, name)) for name, label in figures.PHASES]
        table.add_row("step time split", ", ".join(
            f"{label} {text.share(v / step)}" for label, v in shares if v is not None))
    console.print(table)
    if (end := ending(run, events)) is not None:
        why = str(end["message"]).removeprefix(f"{run['status']}: ")
        console.print(f"[bold red]{run['status']}[/] at step {end['step']}: {why}",
                      highlight=False)
    trials = tuning_trials(store, run["run_id"])
    if trials:
        decisions = Table(title="tuning decisions", title_justify="left")
        for column in ("#", "trial", "status", "samples/s [95% CI]", "vs plan [95% CI]",
                       "decision"):
            decisions.add_column(column)
        for row in trial_rows(trials):
            decisions.add_row(*row)
        print_fitted(console, decisions, spill=("decision",))
    if workers := figures.async_workers(groups):
        asynchronous = Table(title="asynchronous workers", title_justify="left")
        for column in figures.ASYNC_HEADER:
            asynchronous.add_column(column)
        for row in workers:
            asynchronous.add_row(*row)
        console.print(asynchronous)
    if not findings:
        console.print("[dim]no timing figures recorded: nothing to diagnose[/dim]")
    rows = segments(events)
    if len(rows) > 1:
        console.print("segments: " + "; ".join(f"from step {r[0]}: {r[2]}" for r in rows),
                      highlight=False)
    for f in findings:
        refuted = (f.validation or {}).get("state") == "refuted"
        console.print(f"[{SEVERITY_STYLE.get(f.severity, 'bold')}]{f.kind}[/]"
                      f"{' (refuted)' if refuted else ''} ({f.severity}): {f.message}",
                      highlight=False)
        if check := validation_text(f):
            console.print(f"    {check}", highlight=False)
        for s in f.suggestions:
            console.print(f"    - {s}", highlight=False)
