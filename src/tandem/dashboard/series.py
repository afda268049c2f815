"""A run's lines and heatmaps as a page draws them, downsampled on the server.

Each metric is read in the order of the store's (run_id, name, step) index, one metric
at a time, and cut down to the page's point budget keeping every bucket's extremes
(`downsample.minmax_indices`): a 10k-window line sends ~2000 points, spikes included.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from tandem.dashboard import queries, shape
from tandem.dashboard.downsample import DEFAULT_COLUMNS, DEFAULT_POINTS
from tandem.monitor.catalogue import HEATMAPS


def run_lines(conn: sqlite3.Connection, run_id: str, limit: int = DEFAULT_POINTS,
              columns: int = DEFAULT_COLUMNS, names: Sequence[str] | None = None,
              job_only: bool = False, times: bool = True) -> dict[str, Any]:
    """{"series": name -> rank -> line, "heatmaps", "last_step", "last_time"} of a run:
    the job-wide line of each metric where there is one, else each rank's (up to
    shape.MAX_RANK_LINES), and the rank x window heatmaps of catalogue.HEATMAPS."""
    series: dict[str, dict[str, Any]] = {}
    heatmaps: dict[str, Any] = {}
    last_step, last_time = 0, None
    for name in queries.metric_names(conn, run_id):
        if names is not None and name not in names:
            continue
        by_rank = queries.name_points(conn, run_id, name)
        for points in by_rank.values():
            last_step = max(last_step, points[-1][0])
            latest = max(p[2] for p in points[-3:])
            last_time = latest if last_time is None else max(last_time, latest)
        if shape.JOB in by_rank:
            chosen = [shape.JOB]
        else:
            chosen = [] if job_only else sorted(by_rank)[:shape.MAX_RANK_LINES]
        if chosen:
            series[name] = {str(r): shape.series_payload(by_rank[r], limit, times)
                            for r in chosen}
        if not job_only and name in HEATMAPS:
            if (heat := shape.heatmap(by_rank, columns)) is not None:
                heatmaps[name] = heat
    return {"series": series, "heatmaps": heatmaps, "last_step": last_step,
            "last_time": last_time}
