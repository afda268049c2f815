"""The dashboard's web app: page, JSON and stream routes over a read-only run store."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tandem.dashboard import queries, stream, view_run
from tandem.dashboard.auth import TokenGate, check_token
from tandem.dashboard.labels import as_json as labels_json
from tandem.dashboard.pages import PAGES, Page
from tandem.dashboard.reader import Reader, StoreUnavailable
from tandem.monitor import catalogue
from tandem.status import JobStatus, RunStatus

log = logging.getLogger("tandem")
NO_STORE = {"cache-control": "no-store"}
FINDINGS_CACHE = 16  # diagnoses kept (a big run's takes seconds)
JS = "text/javascript"
# The metric catalogue and the stored states, for the pages' scripts: they name metrics and
# states through `tandem.catalogue` rather than by literals of their own.
CATALOGUE_PATH = "/catalogue.js"
CATALOGUE_SCRIPT = "window.tandem = window.tandem || {};\nwindow.tandem.catalogue = " + json.dumps(
    {**catalogue.as_dict(), "jobs": {s.name: s.value for s in JobStatus},
     "runs": {s.name: s.value for s in RunStatus}}, sort_keys=True) + ";\n"

LABELS_JSON = labels_json()  # the same for every page


def _args(request: Request) -> dict[str, str]:
    return {**dict(request.query_params), **request.path_params}


def _embed(data: Any) -> str:
    """JSON that is safe inside <script type="application/json">."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029",
                                                                             "\\u2029")


class Dashboard:
    """The app's state: the store reader, the change watcher and the templates."""

    def __init__(self, store: Path | str, poll_s: float = stream.POLL_S) -> None:
        self.reader = Reader(store)
        self.watcher = stream.Watcher(self.reader, poll_s)
        self._lock = threading.Lock()
        self._diagnoses: dict[tuple, dict[str, Any]] = {}
        self.templates = jinja2.Environment(
            loader=jinja2.PackageLoader("tandem.dashboard", "templates"),
            autoescape=jinja2.select_autoescape(["html"]), undefined=jinja2.StrictUndefined)
        self.templates.globals["run_statuses"] = [s.value for s in RunStatus]

    def _load(self, page: Page, args: dict[str, str]) -> dict[str, Any]:
        with self.reader.snapshot() as conn:
            return page.load(conn, args)

    async def _data(self, page: Page, request: Request) -> dict[str, Any] | Response:
        try:
            return await run_in_threadpool(self._load, page, _args(request))
        except view_run.NotFound as err:
            return PlainTextResponse(str(err), 404)
        except StoreUnavailable as err:
            return PlainTextResponse(f"run store unavailable: {err}", 503, headers=NO_STORE)
        except ValueError as err:
            return PlainTextResponse(str(err), 400)

    def html_route(self, page: Page) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            data = await self._data(page, request)
            if isinstance(data, Response):
                return data
            body = self.templates.get_template(page.template).render(
                page=page, pages=[p for p in PAGES if p.nav], data=_embed(data),
                labels=LABELS_JSON,
                store=str(self.reader.path), live=page.updates is not None)
            return HTMLResponse(body, headers=NO_STORE)
        return endpoint

    def json_route(self, page: Page) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            data = await self._data(page, request)
            return data if isinstance(data, Response) else JSONResponse(data, headers=NO_STORE)
        return endpoint

    def stream_route(self, page: Page) -> Callable[[Request], Any]:
        assert page.updates is not None
        updates = page.updates

        async def endpoint(request: Request) -> Response:
            # A reconnecting EventSource sends the id of the last message it got.
            cursor = stream.parse_cursor(request.headers.get("last-event-id")
                                         or request.query_params.get("cursor"))
            args = {k: v for k, v in _args(request).items() if k != "cursor"}
            return StreamingResponse(
                stream.events(self.watcher, self.reader, updates, args, cursor),
                media_type="text/event-stream",
                headers={**NO_STORE, "x-accel-buffering": "no"})
        return endpoint

    def _findings(self, args: dict[str, str]) -> dict[str, Any]:
        with self.reader.snapshot() as conn:
            run = queries.run(conn, args["run_id"])
            if run is None:
                raise view_run.NotFound(f"no run {args['run_id']!r} in the store")
            # A finished run's diagnosis does not change; a live one's changes with rows.
            key = (run["run_id"], run["status"], run["finished"],
                   queries.max_rowid(conn, "metrics") if run["status"] == RunStatus.RUNNING else 0)
            with self._lock:
                if key in self._diagnoses:
                    return self._diagnoses[key]
            found = view_run.findings(conn, args)
        with self._lock:
            self._diagnoses[key] = found
            while len(self._diagnoses) > FINDINGS_CACHE:
                self._diagnoses.pop(next(iter(self._diagnoses)))
        return found

    async def findings(self, request: Request) -> Response:
        """The diagnosis of one run (it reads every row: kept per run state)."""
        def compute() -> dict[str, Any]:
            return self._findings(_args(request))
        try:
            return JSONResponse(await run_in_threadpool(compute), headers=NO_STORE)
        except view_run.NotFound as err:
            return PlainTextResponse(str(err), 404)
        except StoreUnavailable as err:
            return PlainTextResponse(f"run store unavailable: {err}", 503)

    def routes(self) -> list[BaseRoute]:
        """Every route: pages, their JSON and streams, the diagnosis, static files."""
        out: list[BaseRoute] = [Route("/", lambda r: RedirectResponse("/runs", 307))]
        for page in PAGES:
            out += [Route(page.path, self.html_route(page), name=page.name),
                    Route("/api" + page.path, self.json_route(page))]
            if page.updates is not None:
                out.append(Route("/stream" + page.path, self.stream_route(page)))
        out.append(Route("/api/run/{run_id}/findings", self.findings))
        out.append(Route(CATALOGUE_PATH, lambda r: Response(CATALOGUE_SCRIPT, media_type=JS)))
        out.append(Mount("/static", StaticFiles(packages=[("tandem.dashboard", "static")]),
                         name="static"))
        return out

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        """Poll the store while the app serves; close every connection after."""
        task = asyncio.create_task(self.watcher.run())
        try:
            yield
        finally:
            self.watcher.stop()
            await task
            self.reader.close()


def create_app(store: Path | str, token: str | None = None,
               poll_s: float = stream.POLL_S,
               extra: Sequence[Middleware] = ()) -> Starlette:
    """The dashboard over the store at `store`; with `token`, every route requires it."""
    check_token(token)
    dash = Dashboard(store, poll_s)
    app = Starlette(routes=dash.routes(), lifespan=dash.lifespan,
                    middleware=[Middleware(TokenGate, token=token), *extra])
    app.state.dashboard = dash
    return app
