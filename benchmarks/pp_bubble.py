"""The pipeline bubble measured against the schedule's prediction, per stage.

    python benchmarks/pp_bubble.py [--schedules GPipe,1F1B] [--micro 2,4,8] [--steps 40]

Each (schedule, m) trains the char-LM on two pipeline stages (`tandem run`, two
processes, one thread each) with m micro-batches of 8 sequences a step. Per rank it
prints the idle share measured (`pp/bubble`: 1 - the rank's forward and backward time
over the step's span, from the first stage's start to the drain's end) and the one
predicted from the schedule's action table at the measured per-stage costs and the
schedule's own time per action (`pp/bubble_predicted`), medians over the logging windows after
the first, their difference in percentage points, and the textbook (p-1)/(m+p-1) for
equal stages. The stages run on separate cores: a host with fewer free cores than stages
measures time-sharing, not the schedule.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from _bench import CHAR_LM, QUIET, child_env, run_checked, steady, table, tandem_command

from tandem.monitor.catalogue import PP_BUBBLE, PP_BUBBLE_PREDICTED
from tandem.monitor.store import RunStore

PP, MICRO_SIZE = 2, 8


def per_rank(store_path: Path, name: str, metric: str) -> list[float]:
    """Steady (median after the first window) value of `metric` for each rank."""
    with RunStore(store_path) as store:
        rows = store.metrics(store.run(name)["run_id"], name=metric)
    return [steady([r["value"] for r in rows if r["rank"] == rank]) for rank in range(PP)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", default="GPipe,1F1B")
    ap.add_argument("--micro", default="2,4,8", help="micro-batches a step")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    print(f"host load (1 min): {os.getloadavg()[0]:.1f}")
    rows, worst = [], 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in args.schedules.split(","):
            for m in map(int, args.micro.split(",")):
                name = f"{schedule}-m{m}"
                flags = ["--plan.pp", str(PP), "--plan.pp_schedule", schedule,
                         "--plan.pp_microbatches", str(m),
                         "--train.global_batch", str(MICRO_SIZE * m),
                         "--train.steps", str(args.steps), "--monitor.log_every", "5",
                         "--run.dir", tmp, "--run.name", name, *QUIET]
                run_checked(tandem_command(["--nproc-per-node", str(PP)], CHAR_LM, flags),
                            timeout=900, env=child_env(), what=name)
                store = Path(tmp) / "tandem.db"
                measured = per_rank(store, name, PP_BUBBLE)
                predicted = per_rank(store, name, PP_BUBBLE_PREDICTED)
                for rank in range(PP):
                    diff = 100 * (measured[rank] - predicted[rank])
                    worst = max(worst, abs(diff))
                    rows.append([schedule, str(m), str(rank), f"{measured[rank]:.3f}",
                                 f"{predicted[rank]:.3f}", f"{diff:+.1f}",
                                 f"{(PP - 1) / (m + PP - 1):.3f}"])
    print(table(["schedule", "m", "rank", "measured", "predicted", "diff (pp)",
                 "(p-1)/(m+p-1)"], rows))
    print(f"largest |measured - predicted|: {worst:.1f} percentage points")


if __name__ == "__main__":
    main()
