"""How long a checkpoint holds up training: background save against a synchronous one.

Runs the char-LM example on 2 processes with a checkpoint every few steps, once with
`checkpoint.async_save = true` (the default: the step waits only for the copy into host
staging buffers) and once with it false (the step waits for the whole DCP write, the
hashing and the commit), interleaved over repeats, and prints the median blocking time
of each and their ratio, with the whole runs' wall times beside them.

    python benchmarks/checkpoint_blocking.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _bench import CHAR_LM, child_env, run_checked, tandem_command, window_values


def one_run(out: Path, name: str, async_save: bool, steps: int, every: int) -> dict:
    """Blocking seconds of each checkpoint of one run, and the run's wall time."""
    store = out / "tandem.db"
    flags = ["--train.steps", str(steps), "--checkpoint.every", str(every),
             "--checkpoint.keep", "2", "--checkpoint.async_save", str(async_save).lower(),
             "--monitor.progress", "off", "--run.dir", str(out), "--run.name", name,
             "--monitor.store", str(store), "--train.eval_every", "0"]
    started = time.perf_counter()
    run_checked(tandem_command(["--nproc-per-node", "2"], CHAR_LM, flags), timeout=900,
                env=child_env(), what=f"char-LM run {name}")
    wall = time.perf_counter() - started
    return {"blocked": window_values(store, name, "time/checkpoint_blocking_s"), "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    ns = parser.parse_args()
    found: dict[bool, dict[str, list[float]]] = {True: {"blocked": [], "wall": []},
                                                 False: {"blocked": [], "wall": []}}
    with tempfile.TemporaryDirectory(prefix="tandem-ckpt-bench-") as tmp:
        for rep in range(ns.repeats):
            for mode in (True, False) if rep % 2 == 0 else (False, True):
                got = one_run(Path(tmp), f"r{rep}-{'async' if mode else 'sync'}", mode,
                              ns.steps, ns.every)
                found[mode]["blocked"] += got["blocked"]
                found[mode]["wall"].append(got["wall"])
    print(f"char-LM, 2 processes, {ns.steps} steps, a checkpoint every {ns.every} steps, "
          f"{ns.repeats} interleaved repeats")
    print(f"{'mode':<12}{'saves':>6}{'median block ms':>17}{'max block ms':>14}"
          f"{'median run s':>14}")
    for mode, label in ((True, "background"), (False, "synchronous")):
        blocked = found[mode]["blocked"]
        print(f"{label:<12}{len(blocked):>6}{1e3 * statistics.median(blocked):>17.1f}"
              f"{1e3 * max(blocked):>14.1f}{statistics.median(found[mode]['wall']):>14.1f}")
    ratio = (statistics.median(found[False]["blocked"])
             / max(statistics.median(found[True]["blocked"]), 1e-9))
    print(f"synchronous / background median blocking time: {ratio:.1f}x")


if __name__ == "__main__":
    main()
