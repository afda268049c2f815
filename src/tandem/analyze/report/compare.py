"""Runs side by side: a table of their key numbers and config differences, overlaid curves."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from rich.table import Table

from tandem.analyze import text
from tandem.analyze.diagnosis.diagnose import diagnose_run, verdict
from tandem.analyze.report import figures, html, panels, svg
from tandem.monitor.catalogue import LOSS, SAMPLES_PER_S, TIME_STEP
from tandem.monitor.store import RunStore


def _gather(store: RunStore, run_ids: Sequence[str]) -> list[dict[str, Any]]:
    if not run_ids:
        raise ValueError("compare needs at least one run id, id prefix or name; got none")
    out = []
    for key in run_ids:
        run = store.run(key)
        metrics = store.metrics(run["run_id"])
        found = verdict(diagnose_run(run, metrics, store.events(run["run_id"])))
        out.append({"run": run, "groups": figures.by_name(metrics),
                    "head": figures.headline(run, metrics),
                    "verdict": found.kind if found else text.DASH})
    return out


def _label(run: Mapping[str, Any]) -> str:
    # A new run's id is its name and a time stamp: the stamp tells two runs apart.
    run_id = str(run["run_id"])
    if run_id.startswith(f"{run['name']}-"):
        return f"{run['name']} ({run_id[len(run['name']) + 1:]})"
    return f"{run['name']} ({run_id[:8]})"


def config_differences(runs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(dotted key, value per run) for config and plan keys that differ between runs."""
    # Config keys as the user writes them (data.workers); keys of the resolved plan
    # the trainer recorded are marked, since the config has a `plan` section too.
    flat = [dict(html.flatten(r.get("config") or {}))
            | dict(html.flatten(r.get("plan") or {}, "resolved plan: ")) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    out = []
    for key in keys:
        values = [f.get(key, text.DASH) for f in flat]
        if len(set(values)) > 1:
            out.append((key, values))
    return out


def _rows(gathered: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """(row label, value per run) for the comparison table."""
    heads = [g["head"] for g in gathered]
    base = heads[0]["samples_per_s"]
    evals = sorted({k for h in heads for k in h if k not in figures.HEADLINE_KEYS})

    def speedup(h: Mapping[str, Any]) -> str:
        v = h["samples_per_s"]
        return f"{v / base:.2f}x" if v and base else text.DASH

    rows: list[tuple[str, list[str]]] = [
        ("status", [g["run"]["status"] for g in gathered]),
        ("steps", [f"{h['steps']:,}" for h in heads]),
        ("wall time (all attempts)", [text.seconds(h["duration_s"]) for h in heads]),
        ("final loss", [text.number(h["final_loss"]) for h in heads]),
        *[(name, [text.number(h.get(name)) for h in heads]) for name in evals],
        ("samples/s (median window, training time)",
         [text.number(h["samples_per_s"]) for h in heads]),
        ("samples/s vs first run", [speedup(h) for h in heads]),
        ("tokens/s", [text.number(h["tokens_per_s"]) for h in heads]),
        ("step time", [text.seconds(h["step_s"]) for h in heads]),
        ("MFU", [text.share(h["mfu"]) for h in heads]),
        ("CUDA peak", [text.nbytes(h["cuda_peak_bytes"]) for h in heads]),
        ("verdict", [g["verdict"] for g in gathered]),
    ]
    rows = [(label, values) for label, values in rows if any(v != text.DASH for v in values)]
    rows += config_differences([g["run"] for g in gathered])
    return rows


def compare_table(store: RunStore, run_ids: Sequence[str]) -> Table:
    """A rich table of the runs side by side (key numbers, then config differences)."""
    gathered = _gather(store, run_ids)
    table = Table(title="tandem compare", title_justify="left")
    table.add_column("", style="bold")
    for g in gathered:
        table.add_column(_label(g["run"]), justify="right")
    for label, values in _rows(gathered):
        table.add_row(label, *values)
    return table


def _overlay(gathered: Sequence[Mapping[str, Any]], name: str, title: str,
             data_id: str) -> str:
    lines = [svg.Line(_label(g["run"]), *figures.series_of(g["groups"], name))
             for g in gathered]
    return panels.line_panel(title, data_id, lines)


def render_compare(store: RunStore, run_ids: Sequence[str]) -> str:
    """The comparison page as an HTML string."""
    gathered = _gather(store, run_ids)
    rows = _rows(gathered)
    table = html.list_table([""] + [_label(g["run"]) for g in gathered],
                            [[label, *values] for label, values in rows],
                            numeric=[False] + [True] * len(gathered))
    evals = sorted({n for g in gathered for n in figures.eval_names(g["groups"])})
    charts = [_overlay(gathered, LOSS, "Loss", "data-loss"),
              *[_overlay(gathered, n, n, f"data-eval-{n}") for n in evals[:4]],
              _overlay(gathered, SAMPLES_PER_S, "Throughput (samples/s)", "data-throughput"),
              _overlay(gathered, TIME_STEP, "Step time (s)", "data-step")]
    names = ", ".join(escape(str(g["run"]["name"])) for g in gathered)
    body = (f"<header><h1>Comparison</h1><div class=\"sub\">{names}</div></header>"
            f"<h2>Side by side</h2>{html.card('Runs', table)}"
            f"<h2>Curves</h2><div class=\"grid\">{''.join(c for c in charts if c)}</div>"
            + html.data_block("data-runs", {"runs": [
                {"run_id": g["run"]["run_id"], "name": g["run"]["name"],
                 "headline": g["head"], "verdict": g["verdict"]} for g in gathered]})
            + f"<footer>tandem compare · {escape(str(store.path))} · generated "
              f"{text.when(time.time())}</footer>")
    return html.page("tandem · compare", body)


def compare(store: RunStore, run_ids: Sequence[str], path: Path) -> Path:
    """Write the comparison of runs (ids, id prefixes or names) to `path`; returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(render_compare(store, run_ids), encoding="utf-8")
    tmp.replace(path)
    return path
