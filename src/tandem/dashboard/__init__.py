"""The live dashboard: a read-only web app over the run store (`tandem dashboard`).

Entry points: `DashboardServer` (serve beside a run or in the foreground) and
`create_app` (the ASGI app). Needs the `dashboard` extra (starlette, uvicorn, jinja2);
they load on first use, so that the command line works without that extra.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["DashboardServer", "create_app"]
_HOMES = {"DashboardServer": "tandem.dashboard.server", "create_app": "tandem.dashboard.app"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'tandem.dashboard' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
