"""A run's record beyond its checkpoints, written by rank 0: its row in the run store and
the sinks beside it while it trains; at its end the summary (with scaling efficiency
against a one-process run), the HTML report; no row at all for a run refused before its
first step. Other ranks hold the same object and write nothing."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from tandem.config import Config, MonitorConfig
from tandem.monitor.recorder import Recorder
from tandem.monitor.sinks import Fanout, Sink, open_sinks
from tandem.monitor.store import RunStore, store_location
from tandem.status import RunStatus
from tandem.trainer.progress import Reporter, print_summary
from tandem.trainer.rundir import record_config

log = logging.getLogger("tandem")

SUMMARY_FILE = "summary.json"


class RunRecord:
    """What rank 0 (`active`) writes about one run, in `run_dir` and in the run store."""

    def __init__(self, monitor: MonitorConfig, run_root: str, run_dir: Path, name: str,
                 active: bool) -> None:
        self.monitor, self.run_dir, self.name, self.active = monitor, run_dir, name, active
        self.store = store_location(monitor.store or None, run_root)
        self.run_id = ""

    def finished(self, step: int) -> dict[str, Any] | None:
        """The summary a finished run left (shown on rank 0), or None if it left none."""
        path = self.run_dir / SUMMARY_FILE
        if not path.is_file():
            return None
        summary: dict[str, Any] = json.loads(path.read_text())
        if self.active:
            log.info("run %r is already complete at step %d (summary below); raise "
                     "train.steps to continue it, or give another --run.name", self.name, step)
            print_summary(summary, Console(stderr=True))
        return summary

    def open(self, config: Config, run_id: str, plan: dict[str, Any], device: torch.device,
             world_size: int, step: int) -> Reporter:
        """Start the record (the config beside the checkpoints, the store's row, the sinks)
        and hand back the Reporter every rank reports through."""
        self.run_id = run_id
        recorder: Sink | None = None
        if self.active:
            record_config(config, self.run_dir)
            # Sinks first: a busy port must not leave a run recorded as running.
            sinks = open_sinks(tensorboard=self.monitor.tensorboard,
                               prometheus_port=self.monitor.prometheus_port,
                               prometheus_host=self.monitor.prometheus_host,
                               run_id=run_id, run_dir=self.run_dir)
            recorder = Recorder(self.store, run_id, self.name, config.to_dict(), plan,
                                str(device), world_size)
            if sinks:
                recorder = Fanout(recorder, *sinks)
        return Reporter(recorder, config.train.steps, step, self.monitor.progress,
                        active=self.active)

    def close(self, reporter: Reporter, summary: dict[str, Any] | None, status: RunStatus,
              steps: int, world_size: int, forget: bool) -> None:
        """End the record: a completed run's summary gains its scaling figures and is
        written beside the checkpoints, then shown and stored; its report follows. A run
        to `forget` (refused before its first step, its message said) leaves no row."""
        completed = self.active and summary is not None and status == RunStatus.COMPLETED
        try:
            if completed and summary is not None:
                summary.update(self._scaling(summary, world_size))
                (self.run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        finally:
            reporter.close(summary, status, steps)
        if (completed and self.monitor.report) or (self.active and forget):
            self._after(forget)

    def _scaling(self, summary: dict[str, Any], world_size: int) -> dict[str, Any]:
        """Scaling efficiency against a comparable one-process run, or why there is none."""
        # Imported here: the analysis stack is for the run's end, not its start-up.
        from tandem.analyze.scaling.efficiency import scaling_figures

        try:
            return scaling_figures(self.store, self.run_id, summary.get("samples_per_s", 0.0),
                                   world_size, int(summary.get("steps", 0)))
        except Exception as err:  # an analysis must never fail the run it describes
            log.warning("scaling efficiency: %s", err)
            return {}

    def _after(self, forget: bool) -> None:
        """A refused run taken out of the store (`forget`), or a completed run's HTML
        report beside its checkpoints. Neither may fail the run or hide its message."""
        try:
            with RunStore(self.store) as store:
                if forget:
                    store.delete_run(self.run_id)
                    return
                from tandem.analyze.report.run_report import write_html

                path = write_html(store, self.run_id, self.run_dir / "report.html")
        except Exception as err:
            if forget:
                log.warning("run store: could not remove refused run %s: %s", self.run_id, err)
            else:
                log.warning("report: %s", err)
            return
        log.info("report: %s (or: tandem report %s)", path, self.run_id)
