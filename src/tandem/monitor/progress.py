"""What rank 0 shows and records while a run goes: progress, metric lines, final summary."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

log = logging.getLogger("tandem")


class Reporter:
    """Rank 0's view of the run: a live bar or log lines, and `metrics.jsonl`.

    Other ranks get a Reporter with `active=False`, which does nothing.
    """

    def __init__(self, run_dir: Path | None, total_steps: int, start_step: int, mode: str,
                 active: bool) -> None:
        self.active = active
        self.total = total_steps
        self._file: IO[str] | None = None
        self._bar: Progress | None = None
        self._task: Any = None
        if not active:
            return
        if run_dir is not None:
            self._file = (run_dir / "metrics.jsonl").open("a", encoding="utf-8")
        if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
            self._bar = Progress(
                TextColumn("[bold]step"), MofNCompleteColumn(), BarColumn(),
                TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                TextColumn("eta"), TimeRemainingColumn(),
                console=Console(stderr=True), transient=False,
            )
            self._task = self._bar.add_task("train", total=total_steps, completed=start_step,
                                            status="")
            self._bar.start()
        self._log_lines = mode in ("log", "auto") and self._bar is None

    def record(self, row: dict[str, Any]) -> None:
        """Append one row (step, time and named values) to metrics.jsonl."""
        if self._file is not None:
            self._file.write(json.dumps({"time": time.time(), **row}) + "\n")

    def train(self, step: int, loss: float, lr: float, samples_per_s: float,
              extra: dict[str, float]) -> None:
        """Show and record the figures of a logging window that ended at `step`."""
        if not self.active:
            return
        self.record({"kind": "train", "step": step, "loss": loss, "lr": lr,
                     "samples_per_s": samples_per_s, **extra})
        if self._file is not None:
            self._file.flush()
        status = f"loss {loss:.4f}  {samples_per_s:,.0f} samples/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, status=status)
        elif self._log_lines:
            log.info("step %d/%d  %s  lr %.3g", step, self.total, status, lr)

    def advance(self, step: int) -> None:
        """Move the bar without recording anything."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        """Show and record evaluation results."""
        if not self.active:
            return
        self.record({"kind": "eval", "step": step, **values})
        if self._file is not None:
            self._file.flush()
        shown = "  ".join(f"{k} {v:.4f}" for k, v in values.items())
        message = f"eval @ step {step}: {shown}"
        if self._bar is not None:
            self._bar.console.print(message)
        elif self._log_lines:
            log.info(message)

    def event(self, step: int, kind: str, message: str) -> None:
        """Record and show something that happened (resume, restart, target reached)."""
        if not self.active:
            return
        self.record({"kind": "event", "step": step, "event": kind, "message": message})
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            log.info(message)

    def close(self, summary: dict[str, Any] | None) -> None:
        """Stop the bar, print the summary table, close the file."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.stop()
        if summary is not None:
            print_summary(summary, Console(stderr=True))
        if self._file is not None:
            self._file.close()


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """A short table of the run's outcome."""
    table = Table(title=f"tandem run {summary.get('name', '')}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        if key == "name":
            continue
        if isinstance(value, float):
            value = f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.1f}"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in value.items())
        table.add_row(key.replace("_", " "), str(value))
    console.print(table)
