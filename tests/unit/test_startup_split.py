"""The run's summary splits the process's start-up to its first step into its phases."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.monitor.startup import PARTS, StartupSplit

ROOT = Path(__file__).resolve().parents[2]

_TWO_RUNS = """
import json, sys, time
import tandem
from tests.dist import toy_task
out = []
for name in ("first", "second"):
    cfg = toy_task.config(sys.argv[1], 4, 20, checkpoint={"at_end": False})
    cfg.run.name = name
    called = time.time()
    summary = tandem.fit(toy_task.task(), config=cfg).summary
    out.append({"called": called, **summary})
print(json.dumps(out))
"""


@pytest.mark.timeout(240)  # a fresh interpreter and two short runs, on a slow host too
def test_two_runs_in_one_process_split_their_startup(tmp_path: Path) -> None:
    launched = time.time()
    done = subprocess.run([sys.executable, "-c", _TWO_RUNS, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    for run, since in ((first, launched), (second, second["called"])):
        split = run["startup_parts_s"]
        assert set(split) == {"total", "other", *PARTS}
        assert all(value >= 0.0 for value in split.values())
        assert sum(split[p] for p in PARTS) + split["other"] == pytest.approx(split["total"])
        # Counted from no earlier than the process's start (the first run) or the call
        # (the second), to the first step the loop recorded.
        assert split["total"] <= run["train_started_at"] - since + 0.05
        assert split["preflight"] > 0.0  # the trial step ran and was priced
    # The interpreter and the imports belong to the process's first run only.
    assert first["startup_parts_s"]["before_fit"] > 0.0
    assert second["startup_parts_s"]["before_fit"] == 0.0


def test_parts_are_named_and_nested_checks_leave_the_build() -> None:
    split = StartupSplit()
    with pytest.raises(ValueError, match="start-up part 'imports' is not one of"):
        with split.part("imports"):
            pass
    split.begin()
    split.parts.update(before_fit=0.5, build=3.0, preflight=1.0)  # the checks ran in it
    figures = split.figures(split.began + 10.0)
    assert figures["build"] == 2.0 and figures["preflight"] == 1.0
    assert figures["other"] == pytest.approx(10.0 - 0.5 - 3.0)
