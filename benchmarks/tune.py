"""What `tandem tune` costs and what it buys, on a deliberately mis-configured job.

The job (tests/dist/scripts/tune_task.py) loads each sample in 2 ms and runs with
data.workers 0: input-bound. The benchmark

1. runs `tandem tune` on it (its own budget and trial limit),
2. then measures the plan it chose against the default side by side, interleaved
   (default, chosen, default, chosen, ...), every run a fresh `tandem run`,

and prints the trials used, the wall time spent tuning, and the chosen plan's
speed-up over the default with a 95% interval (steady-state samples/s, warm-up windows
dropped as the tuner drops them; one ratio per interleaved pair of runs).

    python benchmarks/tune.py --nproc-per-node 2 --repeats 3
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from tandem.monitor.store import RunStore
from tandem.tune import space
from tandem.tune import stats as tstats
from tandem.tune.trial import TrialRunner

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "dist" / "scripts" / "tune_task.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--budget", default="15m")
    parser.add_argument("--max-trials", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved pairs")
    parser.add_argument("--sleep-ms", default="2", help="loading cost of one sample")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ns = parser.parse_args()
    work = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-bench-tune-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["TUNE_TASK_SLEEP_MS"] = ns.sleep_ms
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT),
                                                            os.environ.get("PYTHONPATH")]))
    store = work / "runs" / "tandem.db"
    started = time.monotonic()
    cmd = [sys.executable, "-m", "tandem.cli", "tune", "--nproc-per-node",
           str(ns.nproc_per_node), "--budget", ns.budget, "--max-trials", str(ns.max_trials),
           "--steps", str(ns.steps), "--log-every", str(ns.log_every),
           "--store", str(store), "--work-dir", str(work / "tune"),
           "--out", str(work / "plan.toml"), str(SCRIPT)]
    subprocess.run(cmd, check=True, cwd=work)
    tuning_s = time.monotonic() - started
    with RunStore(store) as db:
        session = [r for r in db.runs() if "tune" in (r["config"] or {})][-1]
    summary = session["summary"]
    chosen = space.flatten(tomllib.loads((work / "plan.toml").read_text()))

    runner = TrialRunner(str(SCRIPT), [], ns.nproc_per_node, work / "side-by-side", store)
    logs, default_rates, chosen_rates = [], [], []
    for i in range(ns.repeats):  # interleaved pairs, order alternating: AB, BA, ...
        order = [("a", {}), ("b", chosen)] if i % 2 == 0 else [("b", chosen), ("a", {})]
        runs = {who: runner.run(f"bench-{who}-{i}", changes, ns.steps, ns.log_every)
                for who, changes in order}
        a, b = runs["a"].figures.get("wall"), runs["b"].figures.get("wall")
        if runs["a"].ok and runs["b"].ok and a and b:
            default_rates.append(a)
            chosen_rates.append(b)
            logs.append(math.log(b / a))
    print()
    print(f"job: {SCRIPT.name}, {ns.nproc_per_node} process(es), {ns.sleep_ms} ms per sample, "
          "data.workers 0")
    print(f"chosen plan: {chosen or 'keep the default'}")
    print(f"trials used: {summary['trials']} ({summary['runs']} runs)")
    print(f"tuning wall time: {tuning_s:.0f} s")
    claim = summary.get("speedup")
    if claim:
        print(f"claimed speed-up: {claim['estimate']:.3g} [{claim['low']:.3g}, "
              f"{claim['high']:.3g}]x")
    if len(logs) >= 2:
        iv = tstats.mean_interval(logs)
        print(f"default samples/s per run: {[round(x) for x in default_rates]}; chosen: "
              f"{[round(x) for x in chosen_rates]}")
        print(f"speed-up, {len(logs)} interleaved pairs (the run as the unit): "
              f"{math.exp(iv.estimate):.3g} [{math.exp(iv.low):.3g}, {math.exp(iv.high):.3g}]x "
              "(95% CI)")


if __name__ == "__main__":
    main()
