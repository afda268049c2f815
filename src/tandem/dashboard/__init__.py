"""The live dashboard: a read-only web app over the run store (`tandem dashboard`).

Entry points: `DashboardServer` (serve beside a run or in the foreground) and
`create_app` (the ASGI app). Needs the `dashboard` extra (starlette, uvicorn, jinja2).
"""

from tandem.dashboard.app import create_app
from tandem.dashboard.server import DashboardServer

__all__ = ["DashboardServer", "create_app"]
