"""Joint training against each task alone: per-task accuracy and loss of the MNIST-1D
multi-task example (`examples/mnist1d_multitask.py`) at the same number of steps.

For each seed, the arms run interleaved (their order rotates with the seed) on 2
processes: the two sources mixed by size (1:1), mixed with `--data.mix digit=1,parity=3`,
and each source alone (`--only`). Prints every run's per-task test accuracy and loss,
then the median over seeds per arm; mixed arms give each task about half (or a quarter)
of the samples an arm alone gives it.

    python benchmarks/multitask.py --seeds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import QUIET, ROOT, child_env, run_checked, summary, table, tandem_command  # noqa: E402

EXAMPLE = ROOT / "examples" / "mnist1d_multitask.py"
ARMS = {"mixed 1:1": [], "mixed 1:3": ["--data.mix", "digit=1,parity=3"],
        "digit alone": ["--only", "digit"], "parity alone": ["--only", "parity"]}
TASKS = ("digit", "parity")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ns = parser.parse_args()
    runs = Path(ns.dir or tempfile.mkdtemp(prefix="tandem-multitask-")) / "runs"
    env, arms = child_env(), list(ARMS)
    got: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for seed in range(ns.seeds):
        for arm in arms[seed % len(arms):] + arms[:seed % len(arms)]:
            name = f"{arm.replace(' ', '-').replace(':', '')}-{seed}"
            flags = [*QUIET, "--monitor.report", "false", "--run.dir", str(runs),
                     "--run.name", name, "--run.seed", str(seed), *ARMS[arm]]
            run_checked(tandem_command(["--nproc-per-node", str(ns.nproc)], EXAMPLE, flags),
                        timeout=900, env=env, what=f"{arm} seed {seed}")
            values = summary(runs / name)
            got[arm].append({f"{t} {what}": values[f"task/{t}/{key}"] for t in TASKS
                             for what, key in (("acc", "accuracy"), ("loss", "eval_loss"))
                             if f"task/{t}/{key}" in values})
            print(f"seed {seed} {arm:>12}: {got[arm][-1]}", flush=True)
    columns = [f"{t} {what}" for t in TASKS for what in ("acc", "loss")]
    rows = [[arm, *(f"{statistics.median(r[c] for r in got[arm]):.4f}"
                    if all(c in r for r in got[arm]) else "-" for c in columns)]
            for arm in arms]
    print(f"\nmedian over {ns.seeds} seeds (test sets: 1000 samples each)")
    print(table(["arm", *columns], rows))


if __name__ == "__main__":
    main()
