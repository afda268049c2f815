"""Each advice line of the diagnosis only where it applies; one figure quoted once."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tandem.analyze.diagnosis.diagnose import Finding, diagnose
from tandem.analyze.report.run_report import print_summary
from tandem.analyze.synthetic import Synthetic, synthetic_rows
from tandem.monitor.store import RunStore

pytestmark = pytest.mark.timeout(60)

HEAVY = {"time/data": 0.02, "time/compute": 0.85, "time/optim": 0.05}
NODE_ADVICE = "exclude or replace that node"


def _metrics(**kwargs: Any) -> list[dict[str, Any]]:
    rows = synthetic_rows(Synthetic(**kwargs), start=0.0)
    return [{"step": s, "rank": r, "name": n, "value": v, "time": t} for s, r, n, v, t in rows]


def _only(findings: list[Finding], kind: str) -> Finding:
    (found,) = [f for f in findings if f.kind == kind]
    return found


def _accumulation_advice(finding: Finding) -> list[str]:
    return [s for s in finding.suggestions if "accumulation" in s]


def test_fewer_accumulation_steps_only_where_the_run_accumulates() -> None:
    rows = _metrics(shares=HEAVY)
    derived = {"train": {"global_batch": 64, "micro_batch": 0}}
    one = _only(diagnose(rows, config=derived, plan={"accumulation": 1}), "compute-bound")
    assert _accumulation_advice(one) == []
    # micro-batch left to derive: one micro-batch a step, even without a stored plan
    assert _accumulation_advice(_only(diagnose(rows, config=derived), "compute-bound")) == []
    set_micro = {"train": {"global_batch": 64, "micro_batch": 8}}
    four = _only(diagnose(rows, config=set_micro, plan={"accumulation": 4}), "compute-bound")
    assert len(_accumulation_advice(four)) == 1 and "fewer than 4" in four.suggestions[0]
    # a set micro-batch without a plan: the accumulation is not known, nothing is advised
    unknown = _only(diagnose(rows, config=set_micro), "compute-bound")
    assert _accumulation_advice(unknown) == []


def _host_load(rows: list[dict[str, Any]], host_percent: float,
               process_percent: float) -> list[dict[str, Any]]:
    steps = sorted({m["step"] for m in rows if m["name"] == "time/step"})
    return rows + [{"step": s, "rank": -1, "name": name, "value": value, "time": float(s)}
                   for s in steps for name, value in (("sys/cpu_percent", host_percent),
                                                      ("sys/process_cpu_percent",
                                                       process_percent))]


def test_exclude_a_node_only_where_the_run_spans_nodes() -> None:
    rows = _metrics(world_size=4, straggler=1)
    two_hosts = {"world_size": 4, "local_world_size": 2, "cpu_count": 8}
    found = _only(diagnose(rows, env=two_hosts), "straggler")
    assert any(NODE_ADVICE in s for s in found.suggestions)
    # one host: there is no node to exclude
    one_host = {"world_size": 4, "local_world_size": 4, "cpu_count": 8}
    found = _only(diagnose(rows, env=one_host), "straggler")
    assert not any(NODE_ADVICE in s for s in found.suggestions)
    assert any("one host" in s for s in found.suggestions)
    # hosts not recorded: not assumed to be several
    found = _only(diagnose(rows, env={}), "straggler")
    assert not any(NODE_ADVICE in s for s in found.suggestions)


def test_a_straggler_beside_other_jobs_names_their_load() -> None:
    """8 cores at 90% with 4 ranks at 100% each: 7.2 - 4 = 3.2 cores of other jobs."""
    one_host = {"world_size": 4, "local_world_size": 4, "cpu_count": 8}
    loaded = _host_load(_metrics(world_size=4, straggler=1), 90.0, 100.0)
    found = _only(diagnose(loaded, env=one_host), "straggler")
    (line,) = [s for s in found.suggestions if "one host" in s]
    assert "other jobs used ~3.2 cores" in line
    quiet = _host_load(_metrics(world_size=4, straggler=1), 50.0, 100.0)
    found = _only(diagnose(quiet, env=one_host), "straggler")
    assert not any("other jobs" in s for s in found.suggestions)


def test_the_noise_scale_is_one_figure_in_the_table_and_the_text(tmp_path: Path) -> None:
    """A noise scale of 100 through the run, 462 in its last window: the table and the
    diagnosis quote the same steady median (100), not the last value."""
    steps = list(range(10, 310, 10))
    noise = [100.0] * (len(steps) - 1) + [462.0]
    with RunStore(tmp_path / "t.db") as store:
        store.start_run("r", "r", {"train": {"global_batch": 64}}, {}, {"world_size": 1})
        figures = [("time/step", 0.05), ("time/compute", 0.045), ("loss", 1.0)]
        store.log_metrics("r", [(s, -1, name, value, float(s))
                                for s, v in zip(steps, noise, strict=True)
                                for name, value in [("grad_noise_scale", v), *figures]])
        store.finish_run("r", "completed", {"steps": 300})
        console = Console(record=True, width=200)
        print_summary(store, "r", console)
    out = console.export_text()
    table = re.search(r"grad noise scale\W+(\S+)", out)
    said = re.search(r"gradient noise scale ~(\S+) samples", out)
    assert table and said, out
    assert table.group(1) == said.group(1) == "100"
