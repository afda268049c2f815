"""The HTML report, the terminal summary and the comparison, from a synthetic store."""

from __future__ import annotations

import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tandem.analyze.report import svg
from tandem.analyze.report.panels import line_panel
from tandem.analyze.report.run_report import compare, compare_table, print_summary, write_html
from tandem.analyze.synthetic import Synthetic, write_synthetic
from tandem.monitor.store import RunStore

pytestmark = pytest.mark.timeout(60)


class _Blocks(HTMLParser):
    """Collects the JSON data blocks and the tags of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self._id: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "script" and a.get("type") == "application/json":
            self._id = a["id"]

    def handle_data(self, data: str) -> None:
        if self._id is not None:
            self.data[self._id] = json.loads(data)
            self._id = None


def _parse(path: Path) -> _Blocks:
    parser = _Blocks()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    s = RunStore(tmp_path / "runs.db")
    write_synthetic(s, "run-a-1111", "baseline",
                    Synthetic(world_size=4, straggler=1, cuda_total_bytes=80 * 2**30,
                              tokens_per_sample=128))
    s.log_event("run-a-1111", 150, -1, "loss-spike", "loss rose </script> 4x", value=4.0,
                threshold=3.0)
    write_synthetic(s, "run-b-2222", "loader", Synthetic(
        world_size=2, step_s=0.08, shares={"time/data": 0.45, "time/compute": 0.45}),
        config={"data": {"workers": 0, "prefetch": 2}, "plan": {"bucket_mb": 25.0}})
    return s


def test_report_embeds_exactly_the_recorded_loss(store: RunStore, tmp_path: Path) -> None:
    path = write_html(store, "run-a", tmp_path / "out" / "report.html")
    page = _parse(path)
    loss = page.data["data-loss"]["series"][0]
    recorded = store.metrics("run-a-1111", name="loss", rank=-1)
    assert loss["name"] == "loss"
    assert loss["x"] == [m["step"] for m in recorded]
    assert loss["y"] == [m["value"] for m in recorded]
    assert [e["step"] for e in page.data["data-loss"]["events"]] == [150]
    assert page.data["data-loss"]["series"][1]["name"] == "eval_loss"


def test_report_holds_every_panel_and_the_verdict(store: RunStore, tmp_path: Path) -> None:
    path = write_html(store, "baseline", tmp_path / "report.html")
    page = _parse(path)
    for block in ("data-eval", "data-throughput", "data-tokens", "data-phases", "data-ranks",
                  "data-memory", "data-grad_norm", "data-lr", "data-findings", "data-run"):
        assert block in page.data, block
    kinds = [f["kind"] for f in page.data["data-findings"]["findings"]]
    assert kinds[0] == "straggler" and "unstable" in kinds
    ranks = page.data["data-ranks"]
    assert ranks["ranks"] == [0, 1, 2, 3]
    slow = [s for s in ranks["score"][1] if s is not None]
    assert min(slow) > 1.15
    phases = page.data["data-phases"]
    assert phases["names"][:2] == ["time/data", "time/h2d"] and phases["names"][-1] == "other"
    text = path.read_text(encoding="utf-8")
    assert "verdict: straggler" in text and "train.global_batch" in text
    assert text.count("<svg") >= 9


def test_report_opens_offline(store: RunStore, tmp_path: Path) -> None:
    text = write_html(store, "run-a", tmp_path / "r.html").read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<link" not in text and "@import" not in text
    # A message holding "</script>" must not end its data block early.
    assert "loss rose <\\/script> 4x" in text


def test_nan_loss_is_null_in_the_data_and_the_run_is_unstable(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as s:
        write_synthetic(s, "nan-run", "nan", Synthetic(nan_at=200))
        page = _parse(write_html(s, "nan-run", tmp_path / "r.html"))
    y = page.data["data-loss"]["series"][0]["y"]
    assert y[-1] is None and all(v is not None for v in y[:19])
    assert page.data["data-findings"]["findings"][0]["kind"] == "unstable"


def test_report_of_an_empty_run(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.db") as s:
        s.start_run("empty", "empty", {}, {}, {})
        text = write_html(s, "empty", tmp_path / "r.html").read_text(encoding="utf-8")
    assert "no metrics recorded" in text and "nothing to diagnose" in text


def test_long_series_are_thinned_in_the_chart_but_whole_in_the_data() -> None:
    n = 5000
    xs = list(range(n))
    ys = [math.sin(i / 50) for i in xs]
    ys[1234] = 50.0  # a spike must survive thinning
    card = line_panel("Loss", "data-x", [svg.Line("loss", xs, ys)])
    points = re.search(r'<polyline class="series" points="([^"]+)"', card)
    assert points is not None and len(points.group(1).split()) <= svg.MAX_POINTS
    block = re.search(r'<script type="application/json" id="data-x">(.*?)</script>', card)
    assert block is not None and json.loads(block.group(1))["series"][0]["y"] == ys
    top = min(float(p.split(",")[1]) for p in points.group(1).split())
    assert top == pytest.approx(svg.PAD_T + (svg.HEIGHT - svg.PAD_T - svg.PAD_B) * 0.05 / 1.1,
                                abs=2.0)


def test_print_summary(store: RunStore) -> None:
    console = Console(record=True, width=160)
    print_summary(store, "loader", console)
    out = console.export_text()
    assert "tandem run loader (run-b-2222)" in out
    assert re.search(r"input-bound \(high\): data wait is 4\d% of step time", out)
    assert "data.workers 0 -> 2" in out


def test_compare_overlays_runs_and_lists_differences(store: RunStore, tmp_path: Path) -> None:
    path = compare(store, ["run-a", "loader"], tmp_path / "cmp.html")
    page = _parse(path)
    series = page.data["data-loss"]["series"]
    assert [s["name"] for s in series] == ["baseline (run-a-11)", "loader (run-b-22)"]
    assert series[1]["y"] == [m["value"] for m in store.metrics("run-b-2222", name="loss")]
    assert [r["verdict"] for r in page.data["data-runs"]["runs"]] == ["straggler",
                                                                       "input-bound"]
    text = path.read_text(encoding="utf-8")
    assert "data.workers" in text and "vs first run" in text
    console = Console(record=True, width=160)
    console.print(compare_table(store, ["run-a", "loader"]))
    out = console.export_text()
    assert re.search(r"vs first run +│ +1\.00x │ +0\.8\dx", out), out
    assert re.search(r"data\.workers +│ +2 │ +0 ", out), out
    with pytest.raises(ValueError, match="at least one run"):
        compare(store, [], tmp_path / "none.html")


def test_loss_chart_marks_small_outliers_grey_and_instability_red() -> None:
    from tandem.analyze.report import panels
    from tandem.analyze.report.figures import by_name

    rows = [row for i in range(40) for row in (
        {"step": 10 * (i + 1), "rank": -1, "name": "loss", "value": 2.3 * 0.8 ** i, "time": i},
        {"step": 10 * (i + 1), "rank": -1, "name": "grad_norm", "value": 1.5 * 0.85 ** i,
         "time": i})]
    events = [{"step": 305, "rank": -1, "kind": "loss_spike", "message": "z", "value": 0.09},
              {"step": 306, "rank": -1, "kind": "loss_spike", "message": "z", "value": 0.2}]
    html = panels.loss_panel(by_name(rows), events)
    # 0.09 is 3.9% of the starting loss 2.3: small, grey; 0.2 is 8.7%: instability, red
    colours = {step: colour for colour, step in
               re.findall(r'stroke="(#[0-9a-f]{6})"><title>step (\d+):', html)}
    assert colours == {"305": "#667085", "306": "#d92d20"}
    assert "step 305: loss_spike (small on this run: not instability)" in html


def test_pipeline_panel_draws_each_ranks_measured_and_predicted_bubble() -> None:
    import json

    from tandem.analyze.report import panels
    from tandem.analyze.report.figures import by_name

    rows = [{"step": 5 * (w + 1), "rank": rank, "name": name, "value": value + w / 100,
             "time": w}
            for w in range(3) for rank in (0, 1)
            for name, value in (("pp/bubble", 0.3 + rank / 10), ("pp/bubble_predicted", 0.2))]
    html = panels.pipeline_panel(by_name(rows))
    block = re.search(r'<script type="application/json" id="data-pipeline">(.*?)</script>',
                      html, re.S)
    series = {s["name"]: s["y"] for s in json.loads(block.group(1))["series"]}
    assert series["rank 1 measured"] == pytest.approx([0.4, 0.41, 0.42])
    assert series["rank 0 predicted"] == pytest.approx([0.2, 0.21, 0.22])
    assert panels.pipeline_panel(by_name([])) == ""
