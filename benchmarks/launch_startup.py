"""Start-up of `tandem run` with tandem's one-node agent against torchrun's, interleaved.

    python benchmarks/launch_startup.py [--pairs 6] [--nproc 2] [--example mnist1d_cnn]

Each pair runs the same short job twice, once per launcher (`--launcher auto`, which on
one node is tandem's own agent, and `--launcher torchrun`), the order alternating from
pair to pair. A run's start-up is the time from the command's start to its training
loop's 'segment' event in the run store (the moment a resumed or resized job trains
again, as the scheduler measures a resize); its total is the command's wall time.
Prints each pair, then the medians and the median of the per-pair differences.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _bench import QUIET, ROOT, RunStore, child_env, run_checked, tandem_command

LAUNCHERS = ("auto", "torchrun")


def one(example: str, launcher: str, nproc: int, workdir: Path) -> tuple[float, float]:
    """(start-up s, total s) of one short run."""
    store = workdir / "tandem.db"
    flags = [*QUIET, "--train.steps", "20", "--train.eval_every", "0", "--train.target", "",
             "--run.dir", str(workdir / "runs"), "--run.name", "startup",
             "--monitor.store", str(store)]
    cmd = tandem_command(["--launcher", launcher, "--nproc-per-node", str(nproc)],
                         ROOT / "examples" / f"{example}.py", flags)
    began = time.time()
    run_checked(cmd, timeout=300, env=child_env(), what=f"{launcher} run")
    total = time.time() - began
    with RunStore(store) as s:
        events = s.events(s.run("startup")["run_id"])
    segment = min(e["time"] for e in events if e["kind"] == "segment")
    return segment - began, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--example", default="mnist1d_cnn")
    args = parser.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in LAUNCHERS}
    print(f"{args.example}, {args.nproc} processes, {args.pairs} pairs")
    print("pair  launcher   start-up s  total s")
    for pair in range(args.pairs):
        order = LAUNCHERS if pair % 2 == 0 else LAUNCHERS[::-1]
        for launcher in order:
            with tempfile.TemporaryDirectory(prefix="tandem-startup-") as tmp:
                startup, total = one(args.example, launcher, args.nproc, Path(tmp))
            figures[launcher].append((startup, total))
            print(f"{pair:>4}  {launcher:<9}  {startup:>10.2f}  {total:>7.2f}")
    ours, theirs = figures["auto"], figures["torchrun"]
    print()
    for i, what in enumerate(("start-up", "total")):
        mine = statistics.median(f[i] for f in ours)
        base = statistics.median(f[i] for f in theirs)
        saved = [t[i] - o[i] for o, t in zip(ours, theirs, strict=True)]
        print(f"{what:<9} median: tandem's agent {mine:.2f} s, torchrun's {base:.2f} s; "
              f"per pair torchrun's minus tandem's: median {statistics.median(saved):.2f} s "
              f"(range {min(saved):.2f} .. {max(saved):.2f})")


if __name__ == "__main__":
    main()
