"""`tandem dashboard` and `tandem run --dashboard`: start the dashboard, print its URL."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from tandem.monitor.store import DEFAULT_RUN_DIR, add_store_argument, store_location

if TYPE_CHECKING:
    from tandem.dashboard.server import DashboardServer

# The dashboard watches training: training comes first when both want a core.
PRIORITIES = ("idle", "low", "normal")
PRIORITY = "idle"
LOW_NICE = 19


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tandem dashboard`."""
    add_store_argument(parser, ", opened read-only")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; any other address "
                             "requires a token: $TANDEM_DASHBOARD_TOKEN or a printed one)")
    parser.add_argument("--port", type=int, default=0, help="TCP port (default 0: a free one)")
    parser.add_argument("--priority", default=PRIORITY, choices=PRIORITIES,
                        help=f"the server's CPU priority (default {PRIORITY}: on Linux it "
                             "runs only on a core that training leaves free; low: nice "
                             f"{LOW_NICE}, a small share even of a busy core; normal: the "
                             "priority it was started with)")


def _missing_extra(err: ImportError) -> ValueError:
    return ValueError(f"the dashboard needs the 'dashboard' extra ({err.name} is missing): "
                      "pip install -e '.[dashboard]'")


def announce(server: DashboardServer, store: Path, out: TextIO | None = None) -> None:
    """Print where the dashboard listens (the URL carries the token when one is needed)."""
    out = out or sys.stdout
    print(f"tandem dashboard on {store} (read-only): {server.url()}", file=out, flush=True)
    if server.host not in ("127.0.0.1", "localhost", "::1") and server.token:
        print("  the token in that URL is required from any address; keep it private",
              file=out, flush=True)


def run(ns: argparse.Namespace) -> int:
    """Serve in the foreground until Ctrl-C (or SIGTERM); either ends it with status 0.

    uvicorn stops on SIGINT and then raises the signal again for whoever handled it
    before, which is asyncio's runner: that surfaced as a KeyboardInterrupt traceback
    after a clean shutdown. A Ctrl-C before the server has taken the signal over (while
    it imports or opens the store) is the same request to stop."""
    try:
        return _serve(ns)
    except KeyboardInterrupt:
        return 0


def _serve(ns: argparse.Namespace) -> int:
    store = store_location(ns.store)
    if not store.is_file():
        raise ValueError(f"no run store at {str(store)!r} (--store, else $TANDEM_STORE, else "
                         "runs/tandem.db); runs write one to <run.dir>/tandem.db")
    try:
        from tandem.dashboard.server import DashboardServer
    except ImportError as err:
        raise _missing_extra(err) from err
    server = DashboardServer(store, host=ns.host, port=ns.port, priority=ns.priority)
    announce(server, store)
    server.serve_forever()
    return 0


def store_of(args: list[str]) -> Path:
    """The store a script run with `args` writes, resolved as the run resolves it
    (`store_location`): --monitor.store, else $TANDEM_STORE, else --run.dir's tandem.db,
    else runs/tandem.db (the script's own defaults cannot be seen from here)."""
    found: dict[str, str] = {}
    for i, arg in enumerate(args):
        for key in ("--monitor.store", "--run.dir", "--config"):
            if arg == key and i + 1 < len(args):
                found[key] = args[i + 1]
            elif arg.startswith(key + "="):
                found[key] = arg.split("=", 1)[1]
    explicit, run_dir = found.get("--monitor.store"), found.get("--run.dir")
    if "--config" in found and Path(found["--config"]).is_file():
        import tomllib

        tree = tomllib.loads(Path(found["--config"]).read_text())
        explicit = explicit or tree.get("monitor", {}).get("store")
        run_dir = run_dir or tree.get("run", {}).get("dir")
    return store_location(explicit, run_dir or DEFAULT_RUN_DIR)


def beside_run(ns: argparse.Namespace) -> DashboardServer | None:
    """Start the dashboard for `tandem run --dashboard` (None without the flag)."""
    if not getattr(ns, "dashboard", False):
        return None
    try:
        from tandem.dashboard.server import DashboardServer
    except ImportError as err:
        raise _missing_extra(err) from err
    store = Path(ns.dashboard_store) if ns.dashboard_store else store_of(ns.args)
    server = DashboardServer(store, host="127.0.0.1", port=ns.dashboard_port).start()
    announce(server, store.resolve(), sys.stderr)
    return server
