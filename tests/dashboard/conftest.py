"""Fixtures of the dashboard tests: stores written through RunStore, a served dashboard,
and a real headless Chromium driven by Playwright (skipped, with the reason, without)."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra is not installed")
pytest.importorskip("jinja2", reason="the dashboard extra is not installed")

from tandem.analyze.synthetic import Synthetic, write_synthetic  # noqa: E402
from tandem.dashboard.reader import Reader  # noqa: E402
from tandem.dashboard.server import DashboardServer  # noqa: E402
from tandem.dashboard.stream import Watcher  # noqa: E402
from tandem.monitor.store import RunStore  # noqa: E402
from tests.conftest import reap, session_processes  # noqa: E402

CHROMIUM = os.environ.get("TANDEM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
POLL_S = 0.05  # the watcher's poll in tests: updates within a deadline, not by luck


def build_store(path: Path) -> Path:
    """A store with two finished synthetic runs, a live one and a tune session."""
    with RunStore(path) as store:
        write_synthetic(store, "alpha-1", "alpha",
                        Synthetic(steps=300, world_size=4, straggler=2, seed=1))
        write_synthetic(store, "beta-1", "beta",
                        Synthetic(steps=200, world_size=2, seed=2,
                                  shares={"time/data": 0.4, "time/compute": 0.5}),
                        config={"train": {"steps": 200, "global_batch": 32},
                                "data": {"workers": 0, "prefetch": 2}})
        store.start_run("tune-1", "tune-toy",
                        {"tune": {"min_gain": 0.05}, "script": "toy.py", "nproc": 2},
                        {"strategy": "ddp"}, {"world_size": 2})
        store.log_trial("tune-1", "00", {}, "measured",
                        {"label": "baseline", "kind": "baseline",
                         "samples_per_s": {"estimate": 1000.0, "low": 950.0, "high": 1050.0,
                                           "n": 8}}, "diagnosis: balanced (info)")
        store.log_trial("tune-1", "01", {"plan.comm_hook": "none"}, "bound",
                        {"label": "no gradient communication", "kind": "control",
                         "ratio": {"estimate": 1.02, "low": 0.98, "high": 1.04, "n": 8}},
                        "even removing all communication gains only 1.04x: skipped")
        store.log_trial("tune-1", "02", {"data.workers": 2}, "adopted",
                        {"label": "data.workers 2", "kind": "candidate", "predicted": 1.45,
                         "ratio": {"estimate": 1.31, "low": 1.22, "high": 1.40, "n": 8}},
                        "adopted: 1.31x [1.22, 1.40]")
        store.finish_run("tune-1", "completed",
                         {"chosen": {"data.workers": 2}, "trials": 3,
                          "speedup": {"estimate": 1.31, "low": 1.22, "high": 1.40, "n": 8},
                          "noise": {"floor": 1.17, "placebo_pairs": 3}})
        store.start_run("live-1", "live", {"train": {"steps": 1000}}, {"strategy": "single"},
                        {"world_size": 1, "device": "cpu"})
        now = time.time()
        store.log_metrics("live-1", [(s, -1, "loss", 3.0 - s / 100, now) for s in
                                     range(10, 101, 10)])
    return path


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A fresh store file (closed: every writer connection is gone)."""
    return build_store(tmp_path / "tandem.db")


@pytest.fixture
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[..., DashboardServer]]:
    """Start a dashboard (in this process, on a thread); stopped after the test."""
    started: list[DashboardServer] = []

    def start(store_path: Path, **kw: Any) -> DashboardServer:
        kw.setdefault("poll_s", POLL_S)
        kw.setdefault("priority", "low")  # a page under test must not wait on the other lane
        server = DashboardServer(store_path, **kw).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def counted_watcher(store: Path) -> tuple[Reader, Watcher, list[float]]:
    """(reader, watcher, checks): a Watcher polling every POLL_S whose every check of the
    store is noted (its time) in `checks`."""
    reader = Reader(store)
    watcher = Watcher(reader, POLL_S)
    checks: list[float] = []
    check = watcher._check

    def counted() -> bool:
        checks.append(time.monotonic())
        return check()

    watcher._check = counted  # type: ignore[method-assign]
    return reader, watcher, checks


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, Any]:
    """(status, body, headers) of a GET that does not follow redirects."""

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(req, timeout=10) as resp:
            return resp.status, resp.read(), resp.headers
    except urllib.error.HTTPError as err:
        return err.code, err.read(), err.headers


def get_json(url: str, headers: dict[str, str] | None = None) -> Any:
    status, body, _ = get(url, headers)
    assert status == 200, (url, status, body[:300])
    return json.loads(body)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """A headless Chromium (Debian's), or a skip that says what is missing."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
    # A crash handler Chromium started, daemonized (the suite's guard lets it live as
    # long as the browser): gone with it.
    reap([p for p in session_processes(long_lived=True)
          if "chrome_crashpad_handler" in " ".join(p.cmdline())])


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page that records script errors; fails the test if any occur."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    yield pg
    context.close()
    assert not errors, f"the page reported errors: {errors}"


def open_page(pg: Any, url: str) -> None:
    """Load `url` and wait until its script has drawn the page."""
    pg.goto(url)
    pg.wait_for_selector("body[data-ready='1']", timeout=15_000)


def wait_for(check: Callable[[], Any], deadline_s: float, what: str) -> Any:
    """Poll `check` until it returns a truthy value, or fail after `deadline_s`."""
    end = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline_s} s")
        time.sleep(0.05)
