"""The dashboard speaks in words: field and metric names shown as labels with units
(the stored name in the tooltip, config keys as written), and a chart's many lines
each in a look of its own (real Chromium via Playwright)."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

from tandem.analyze.synthetic import Synthetic, write_synthetic
from tandem.monitor.store import RunStore
from tests.dashboard.conftest import open_page

RAW = re.compile(r"^[a-z0-9]+(_[a-z0-9]+)+$|^[a-z]+/[a-z0-9_]+$")  # phase_s, mem/rss_bytes
# Every place a page shows a field or metric name: finding fields, key/value keys and
# headers, card and chart titles, chart legends.
NAMED = (".field > b", "table.kv td:first-child", "table.kv th", ".card h3",
         ".u-legend .u-label", ".heatmap > h3")
TEXTS = "els => els.map(e => e.textContent.trim()).filter(t => t)"
TITLES = "els => els.map(e => e.getAttribute('title')).filter(t => t)"


def _raw_names(page, scope: str = "main") -> list[str]:
    shown = page.eval_on_selector_all(", ".join(f"{scope} {s}" for s in NAMED), TEXTS)
    assert shown, f"nothing named in {scope}"
    return [t for t in shown if RAW.match(t)]


def test_pages_show_words_and_units_not_field_names(store: Path, serve, page) -> None:
    base = serve(store)
    open_page(page, base.url("/run/beta-1", local=True))
    page.wait_for_selector("#findings .finding")
    assert _raw_names(page, "#findings") == []
    for scope in ("#curves", "#phases", "#heatmaps", "#system"):
        assert _raw_names(page, scope) == [], scope
    shown = page.eval_on_selector_all("#findings .field > b", TEXTS)
    assert "evidence" in shown and "predicted speed-up if removed (x)" in shown, shown
    evidence = page.inner_text(".finding[data-kind='input-bound'] [data-field='evidence']")
    assert "time in this phase per step (s)" in evidence and "phase_s" not in evidence
    # the stored name stays at hand, in the tooltip
    titles = page.eval_on_selector_all("#findings .field > b, #findings td[title]", TITLES)
    assert "predicted_speedup" in titles and "phase_s" in titles
    legend = page.eval_on_selector_all("#curves .u-legend .u-label", TEXTS)
    assert "throughput (samples/s)" in legend and "evaluation loss" in legend, legend
    # config and plan keys are what a flag or a plan file names: as written
    assert "global_batch" in page.inner_text("#config")
    open_page(page, base.url("/compare?runs=alpha-1,beta-1", local=True))
    rows = page.eval_on_selector_all("#summary td:first-child", TEXTS)
    assert [r for r in rows if RAW.match(r)] == [] and "evaluation loss, last" in rows, rows
    assert "step time, median (s)" in rows and "duration (s)" in rows, rows
    assert _raw_names(page, "#curves") == []
    open_page(page, base.url("/tuner", local=True))
    assert _raw_names(page, "#decision") == []
    noise = page.inner_text("#decision")
    assert "noise floor (x)" in noise and "placebo pairs" in noise, noise
    assert "data.workers" in noise  # the chosen plan's key, as written


def _delta_e(a: str, b: str) -> float:
    """CIE76 colour difference of two #rrggbb colours (sRGB, D65)."""
    def lab(color: str) -> tuple[float, float, float]:
        rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
        r, g, b = (((c + 0.055) / 1.055) ** 2.4 if c > 0.04045 else c / 12.92 for c in rgb)
        x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
        y = 0.2126 * r + 0.7152 * g + 0.0722 * b
        z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
        f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in (x, y, z)]
        return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])
    return math.dist(lab(a), lab(b))


LOOKS = """id => { const u = tandem.charts[id].u;
  return u.series.slice(1).map((s, i) => ({
    stroke: typeof s.stroke === "function" ? s.stroke(u, i + 1) : s.stroke,
    dash: s.dash || [] })); }"""


def test_a_twelve_line_chart_gives_each_line_its_own_look(tmp_path: Path, serve,
                                                          page) -> None:
    path = tmp_path / "tandem.db"
    with RunStore(path) as store:
        write_synthetic(store, "wide-1", "wide", Synthetic(steps=60, world_size=12, seed=3))
    open_page(page, serve(path).url("/run/wide-1", local=True))
    looks = page.evaluate(LOOKS, "mem/rss_bytes")  # one line per rank
    assert len(looks) == 12
    assert len({(lk["stroke"].lower(), tuple(lk["dash"])) for lk in looks}) == 12, looks
    colours = sorted({lk["stroke"].lower() for lk in looks})
    closest = min(_delta_e(a, b) for a, b in itertools.combinations(colours, 2))
    assert closest >= 30, (closest, colours)  # hues apart, not two shades of one
    legend = page.eval_on_selector_all(".u-legend .u-label", TEXTS)
    assert "host memory, RSS (bytes), rank 11" in legend, legend
