"""Pieces both `tandem tune` modes use: durations, the trial runner, the decision table."""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from tandem.monitor.store import store_location
from tandem.tune import space
from tandem.tune.outcome import Record
from tandem.tune.trial import TrialRunner, strip_flags

STATUS_STYLE = {"adopted": "bold green", "rejected": "bold red", "failed": "red",
                "stopped-early": "yellow", "not-significant": "yellow", "bound": "cyan",
                "confirmed": "cyan", "refuted": "magenta", "inconclusive": "yellow",
                "measured": "bold", "skipped": "dim", "invalid": "dim", "pruned": "yellow",
                "complete": "green", "revoked": "bold yellow", "not-reached": "dim"}


def parse_duration(text: str) -> float:
    """'90s', '10m', '1.5h' or '600' -> seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smh]?)\s*", str(text))
    if not m:
        raise ValueError(f"--budget {text!r} is not a duration; write 90s, 10m or 1h")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]


def base_plan(path: str | None) -> dict[str, Any]:
    """The flat settings of the job's current plan file ({} without one)."""
    if path is None:
        return {}
    if not Path(path).is_file():
        raise ValueError(f"--plan {path!r} does not exist")
    with open(path, "rb") as handle:
        return space.flatten(tomllib.load(handle))


def runner_from(ns: argparse.Namespace) -> TrialRunner:
    """The trial runner that `ns` describes."""
    if not Path(ns.script).is_file():
        raise ValueError(f"script {ns.script!r} does not exist")
    if ns.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node {ns.nproc_per_node} must be >= 1")
    return TrialRunner(script=str(Path(ns.script).resolve()),
                       script_args=strip_flags(ns.args, ["plan"]),
                       nproc=ns.nproc_per_node, work_dir=Path(ns.work_dir).resolve(),
                       store_path=store_location(ns.store), base_plan=base_plan(ns.plan),
                       timeout_s=ns.trial_timeout)


def decision_table(records: list[Record], title: str) -> Table:
    """The decision record as a rich table."""
    from tandem.analyze.report.run_report import trial_rows

    table = Table(title=title, title_justify="left")
    for column in ("#", "trial", "status", "samples/s [95% CI]", "vs plan [95% CI]",
                   "decision"):
        table.add_column(column, overflow="fold")
    rows = trial_rows([{"trial_id": r.trial_id, "status": r.status,
                        "figures": {"label": r.label, **r.figures}, "decision": r.decision}
                       for r in records])
    for row in rows:  # as text, never markup: a failed run's message may hold brackets
        cells = [Text(str(cell)) for cell in row]
        cells[2].stylize(STATUS_STYLE.get(row[2], ""))
        table.add_row(*cells)
    return table
