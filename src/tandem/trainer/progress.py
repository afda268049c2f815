"""What rank 0 shows and records while a run goes: progress, metric lines, final summary."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

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
from rich.text import Text

from tandem.monitor.catalogue import LR
from tandem.monitor.live import Window
from tandem.monitor.sinks import Sink

log = logging.getLogger("tandem")


class Reporter:
    """Rank 0's view of the run: a live bar or log lines, and the run store's record.

    Other ranks get a Reporter with `active=False`, which does nothing.
    """

    def __init__(self, recorder: Sink | None, total_steps: int, start_step: int,
                 mode: str, active: bool) -> None:
        self.active = active
        self.total = total_steps
        self.recorder = recorder
        self._bar: Progress | None = None
        self._task: Any = None
        if not active:
            return
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

    def window(self, window: Window) -> None:
        """Show and record the job-wide figures of a logging window, and its events."""
        if not self.active:
            return
        figures = {name: value for _, rank, name, value in window.rows if rank == -1}
        if self.recorder is not None:
            self.recorder.window(window)
        for event in window.events:
            self._show(event.message)
        status = f"loss {window.loss:.4f}  {window.samples_per_s:,.0f} samples/s"
        if self._bar is not None:
            self._bar.update(self._task, completed=window.step, status=status)
        elif self._log_lines:
            log.info("step %d/%d  %s  lr %.3g", window.step, self.total, status,
                     figures.get(LR, 0.0))

    def advance(self, step: int) -> None:
        """Move the bar without recording anything."""
        if self._bar is not None:
            self._bar.update(self._task, completed=step)

    def record(self, step: int, values: dict[str, float]) -> None:
        """Record job-wide values without showing them."""
        if self.active and self.recorder is not None:
            self.recorder.values(step, values)

    def evaluation(self, step: int, values: dict[str, float]) -> None:
        """Show and record evaluation results."""
        if not self.active:
            return
        if self.recorder is not None:
            self.recorder.values(step, values)
        shown = "  ".join(f"{k} {v:.4f}" for k, v in values.items())
        message = f"eval @ step {step}: {shown}"
        if self._bar is not None:
            self._bar.console.print(message)
        elif self._log_lines:
            log.info(message)

    def event(self, step: int, kind: str, message: str, value: float | None = None,
              threshold: float | None = None) -> None:
        """Record and show something that happened (resume, restart, target, ...)."""
        if not self.active:
            return
        if self.recorder is not None:
            self.recorder.event(step, kind, message, value, threshold)
        self._show(message)

    def _show(self, message: str) -> None:
        if self._bar is not None:
            self._bar.console.print(message)
        else:
            log.info(message)

    def close(self, summary: dict[str, Any] | None, status: str, steps: int = 0) -> None:
        """Stop the bar, print the summary table, finish the run's record (a run that
        ended without a summary records the `steps` it reached)."""
        if not self.active:
            return
        if self._bar is not None:
            self._bar.stop()
        if summary is not None:
            print_summary(summary, Console(stderr=True))
        if self.recorder is not None:
            self.recorder.finish(status, summary if summary is not None else {"steps": steps})


def print_summary(summary: dict[str, Any], console: Console) -> None:
    """A short table of the run's outcome."""
    table = Table(title=f"tandem run {summary.get('name', '')}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    for key, value in summary.items():
        if key == "name":
            continue
        if key.endswith("_at") and isinstance(value, (int, float)):  # a Unix time
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        elif isinstance(value, float):
            value = f"{value:,.4f}" if abs(value) < 1000 else f"{value:,.1f}"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in value.items())
        table.add_row(key.replace("_", " "), Text(str(value)))  # text, not markup
    console.print(table)
