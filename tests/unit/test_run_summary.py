"""The run's closing table: figures readable at a glance."""

from __future__ import annotations

import time

from rich.console import Console

from tandem.trainer.progress import print_summary


def test_times_of_day_print_as_dates_and_figures_as_numbers() -> None:
    console = Console(record=True, width=120)
    started = 1_796_099_949.4
    print_summary({"name": "demo", "train_started_at": started, "wall_time_s": 4.5638,
                   "samples_per_s": 4744.71, "steps": 150}, console)
    text = console.export_text()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    assert when in text and "1,796,099,949" not in text
    assert "4.5638" in text and "4,744.7" in text and "150" in text
