"""Serving the dashboard: on a background thread (beside a run) or in the foreground."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from tandem.dashboard.app import create_app
from tandem.dashboard.auth import is_loopback
from tandem.dashboard.command import LOW_NICE, PRIORITIES, PRIORITY
from tandem.dashboard.stream import POLL_S

log = logging.getLogger("tandem")
TOKEN_ENV = "TANDEM_DASHBOARD_TOKEN"


def lower_priority(priority: str) -> None:
    """Lower this thread's priority (threads it starts later inherit it).

    `idle`: Linux's SCHED_IDLE policy, under which a thread runs on a core only when no
    ordinary thread wants it, and never preempts one on waking; `low`: nice 19, a thread
    that still takes its small share (and preempts on waking); `normal`: unchanged. A nice
    value is also set under `idle`, for a system without SCHED_IDLE. On Linux both belong
    to a thread, so a dashboard serving beside a run lowers its own threads, not the
    launcher's. A priority is only ever lowered, never raised.
    """
    if priority == "normal":
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, max(LOW_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError) as err:  # no per-thread priorities here
        log.debug("the dashboard keeps its nice value: %s", err)
    if priority == "idle":
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError) as err:  # not Linux: nice 19 is what there is
            log.debug("the dashboard runs at nice %d, not SCHED_IDLE: %s", LOW_NICE, err)


def resolve_token(host: str, token: str | None = None) -> str | None:
    """The token to require: `token`, else $TANDEM_DASHBOARD_TOKEN, else a fresh one when
    `host` is not loopback; None (no token) on loopback when none was given."""
    token = token or os.environ.get(TOKEN_ENV) or None
    if token is None and not is_loopback(host):
        token = secrets.token_urlsafe(24)
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port); port 0 picks a free one."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: {port} is not a TCP port (0..65535; 0 picks a free one)")
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host.strip("[]")).version == 6 \
            else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a host name
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as err:
        sock.close()
        raise ValueError(f"--host/--port: cannot listen on {host}:{port}: {err}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server that ends the open event streams as soon as it is told to exit
    (they would otherwise hold the shutdown until its grace period ran out), and that
    wakes once a second, not ten times.

    uvicorn's main loop sleeps 0.1 s between checks of `should_exit` (and refreshes its
    Date header every tenth): beside a run nobody watches, those wake-ups were most of
    what the idle server cost. Here it ticks once a second, the Date header's own
    resolution, and `exit_now()` ends the wait at once."""

    TICK_S = 1.0

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_exit = on_exit
        self.ticks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit = asyncio.Event()

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        counter = 0  # uvicorn's on_tick refreshes the Date header when it is 0 mod 10
        while not await self.on_tick(counter):
            self.ticks += 1
            counter = (counter + 10) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), self.TICK_S)

    def exit_now(self) -> None:
        """Exit (from any thread): the main loop wakes at once."""
        self.should_exit = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: it has exited
                loop.call_soon_threadsafe(self._exit.set)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)
        self.exit_now()


class DashboardServer:
    """The dashboard over one store, listening on (host, port), until stop()."""

    def __init__(self, store: Path | str, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, poll_s: float = POLL_S,
                 priority: str = PRIORITY) -> None:
        self.store = Path(store).expanduser().resolve()
        if priority not in PRIORITIES:
            raise ValueError(f"--priority: {priority!r} is not one of {', '.join(PRIORITIES)}")
        self.priority = priority
        self.host = host
        self.token = resolve_token(host, token)
        self.app = create_app(self.store, self.token, poll_s)
        self.socket = bind(host, port)
        self.port = int(self.socket.getsockname()[1])
        config = uvicorn.Config(self.app, log_level="warning", access_log=False,
                                lifespan="on", timeout_graceful_shutdown=1)
        self.server = _Server(config, self.app.state.dashboard.watcher.stop_threadsafe)
        self._thread: threading.Thread | None = None

    def _address(self, host: str) -> str:
        return f"[{host}]" if ":" in host else host

    def url(self, path: str = "/runs", local: bool = False) -> str:
        """The address to open (with ?token= when one is required).

        `local`: the loopback address (where a wildcard bind is reached from here);
        otherwise this host's name when bound to every interface.
        """
        host = self.host.strip("[]")
        if local or host in ("0.0.0.0", "::"):
            host = ("::1" if ":" in host else "127.0.0.1") if local else socket.gethostname()
        url = f"http://{self._address(host)}:{self.port}{path}"
        return url + (f"?token={self.token}" if self.token else "")

    def serve_forever(self) -> None:
        """Serve in this thread until SIGINT/SIGTERM (uvicorn handles them)."""
        self._serve()

    def _serve(self) -> None:
        lower_priority(self.priority)
        self.server.run(sockets=[self.socket])

    def start(self, timeout: float = 15.0) -> DashboardServer:
        """Serve on a daemon thread; returns once it accepts connections."""
        self._thread = threading.Thread(target=self._serve, name="tandem-dashboard",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the dashboard did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the store connections. Idempotent."""
        self.app.state.dashboard.watcher.stop_threadsafe()
        self.server.exit_now()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the dashboard did not stop within %.0f s", timeout)
        self.socket.close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
