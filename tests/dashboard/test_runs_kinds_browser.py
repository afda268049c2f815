"""The Runs page's kind filter in a real browser (Chromium via Playwright): the user's
runs by default, the tuner's on request, and the Tuner page's way to its session's runs."""

from __future__ import annotations

from pathlib import Path

from tests.dashboard.conftest import open_page
from tests.dashboard.test_runs_kinds import TRIALS, ids_of_kind, store_with_trials

ROWS = "rows => rows.map(r => r.dataset.run)"


def test_the_kind_filter_in_a_browser(tmp_path: Path, serve, page) -> None:
    path = store_with_trials(tmp_path)
    server = serve(path)
    open_page(page, server.url("/runs", local=True))
    users = ids_of_kind(path, ("user",))
    assert set(page.eval_on_selector_all("#runs tbody tr", ROWS)) == users
    count = page.inner_text("#count")
    assert "4 of 4 runs shown (your runs)" in count and "3 more in the store" in count, count
    assert page.eval_on_selector_all("#kind option", "o => o.map(x => x.textContent)") == [
        "your runs (4)", "tuner trials and controls (3)", "every run (7)"]
    with page.expect_navigation():
        page.select_option("#kind", "all")
    page.wait_for_selector("body[data-ready='1']")
    assert set(page.eval_on_selector_all("#runs tbody tr", ROWS)) == users | set(TRIALS)
    assert "tuner control" in page.inner_text("tr[data-run='tune-1-001-placebo']")
    # The Tuner page leads to the session's runs: the session and every run it launched.
    open_page(page, server.url("/tuner?session=tune-1", local=True))
    with page.expect_navigation():
        page.click("#session-runs")
    page.wait_for_selector("body[data-ready='1']")
    assert page.input_value("#search") == "tune-1" and page.input_value("#kind") == "all"
    assert set(page.eval_on_selector_all("#runs tbody tr", ROWS)) == {"tune-1", *TRIALS}
