"""The dashboard's pages. A page is one entry here and one template in templates/.

Each entry names its address, its template, the function that loads what the page
first draws (with a cursor of the rows it holds) and, for live pages, the function that
returns what was committed past that cursor. The app turns each entry into three
routes: the page (HTML with its data inside), `/api<path>` (the same data as JSON) and
`/stream<path>` (server-sent updates). A new page is a new entry whose functions read
its own tables (as the scheduler's page reads the sched_* tables), plus its template.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tandem.dashboard import view_compare, view_run, view_runs, view_sched, view_tuner
from tandem.dashboard.stream import Updates

Load = Callable[[sqlite3.Connection, Mapping[str, str]], dict[str, Any]]


@dataclass(frozen=True)
class Page:
    """One page of the dashboard."""

    name: str
    path: str  # Starlette path, e.g. "/run/{run_id}"
    title: str
    template: str  # a file in templates/
    load: Load
    updates: Updates | None = None  # None: the page does not update itself
    nav: bool = True  # listed in the navigation bar


PAGES: tuple[Page, ...] = (
    Page("runs", "/runs", "Runs", "runs.html", view_runs.load, view_runs.updates),
    Page("run", "/run/{run_id}", "Run", "run.html", view_run.load, view_run.updates,
         nav=False),
    Page("compare", "/compare", "Compare", "compare.html", view_compare.load,
         view_compare.updates),
    Page("tuner", "/tuner", "Tuner", "tuner.html", view_tuner.load, view_tuner.updates),
    Page("sched", "/sched", "Scheduler", "sched.html", view_sched.load, view_sched.updates),
)
