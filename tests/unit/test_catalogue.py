"""The metric catalogue: every name a real run writes is in it, and src/ spells each
name only there."""

from __future__ import annotations

import json
import re
from pathlib import Path

import tandem
from tandem.monitor import catalogue
from tandem.monitor.phases import PHASES
from tandem.monitor.store import RunStore
from tests.dist import toy_task

SRC = Path(__file__).resolve().parents[2] / "src" / "tandem"
# Files whose literals are replaced once their reshaping lands (they name metrics the
# catalogue already holds).
PENDING: set[str] = set()


def test_a_short_run_writes_only_catalogued_names(tmp_path: Path) -> None:
    cfg = toy_task.config(str(tmp_path), 6, 20, checkpoint={"at_end": True})
    task = tandem.Task(model=toy_task.make_model, optimizer=toy_task.make_optimizer,
                       train_data=toy_task.IndexedData, loss=toy_task.loss,
                       eval_data=toy_task.IndexedData)
    tandem.fit(task, config=cfg)
    (store_file,) = tmp_path.rglob("*.db")
    with RunStore(store_file) as store:
        (run,) = store.runs()
        written = set(store.metric_names(run["run_id"]))
    # What a one-process CPU run is known to write, independently of the catalogue.
    assert {"loss", "eval_loss", "samples_per_s", "time/step", "time/data", "time/compute",
            "mem/rss_bytes", "time/checkpoint_blocking_s"} <= written
    missing = sorted(written - set(catalogue.CATALOGUE))
    assert not missing, f"written but not in the catalogue: {missing}"


def test_every_entry_has_a_meaning_and_phases_are_covered() -> None:
    for name, entry in catalogue.CATALOGUE.items():
        assert entry.name == name and entry.meaning, name
    assert {catalogue.phase_metric(p) for p in PHASES} <= set(catalogue.CATALOGUE)
    served = json.loads(json.dumps(catalogue.as_dict()))
    assert served["names"]["TIME_STEP"] == "time/step"
    assert set(served["metrics"]) == set(catalogue.CATALOGUE)
    for group in served["groups"].values():
        assert set(group) <= set(catalogue.CATALOGUE)


def test_src_spells_each_slashed_metric_name_only_in_the_catalogue() -> None:
    names = [n for n in catalogue.CATALOGUE if "/" in n]
    alternatives = "|".join(re.escape(n) for n in names)
    quoted = re.compile(rf"""["']({alternatives})["']""")
    found = []
    for path in [*SRC.rglob("*.py"), *SRC.rglob("*.js")]:
        rel = path.relative_to(SRC).as_posix()
        if rel == "monitor/catalogue.py" or rel in PENDING or "vendor" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if quoted.search(line):
                found.append(f"{rel}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
