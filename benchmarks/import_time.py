"""What `import tandem; tandem.fit` costs above `import torch, torch.distributed`, and the
demo's start-up to its first step, each in fresh interpreters, interleaved.

    python benchmarks/import_time.py [--rounds 10] [--other /path/to/checkout]
                                     [--startup-rounds 5] [--steps 5] [--clock wall|cpu]

Imports: each round times, in one new interpreter per arm and in an order rotating from
round to round, `import torch, torch.distributed` (`torch`) and `import tandem;
tandem.fit` (`tandem`), from the interpreter's start of the statement to its end (the
interpreter's own start is the same for both and left out), in wall-clock seconds or,
with `--clock cpu`, in the interpreter's CPU seconds, which a host busy with other work
inflates far less. With `--other`, a second checkout's `src/` is a third arm (`other`),
e.g. the previous commit:

    git worktree add /tmp/prev HEAD~3 && python benchmarks/import_time.py --other /tmp/prev

Start-up (with `--startup-rounds N`, N > 0): the demo (`examples/mnist1d_cnn.py`, one
process, `--steps` steps, no evaluation, no checkpoint) from the command's start to its
first step (`train_started_at` in the run's summary), this checkout against `--other`'s,
interleaved likewise; with `--clock cpu`, the command's CPU seconds from start to end.

Prints every measurement, then per arm the median, and per compared pair the median of
the per-round differences with a distribution-free 95% interval (order statistics of the
paired differences, the sign test's interval for their median).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STATEMENTS = {"torch": "import torch, torch.distributed",
              "tandem": "import tandem; tandem.fit"}
_TIMED = ("import time; _t, _c = time.perf_counter(), time.process_time(); {stmt}; "
          "print(time.perf_counter() - _t, time.process_time() - _c)")


def env_for(src: Path | None) -> dict[str, str]:
    """A child's environment: `src` first on the path (None: the interpreter's own)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(src), os.environ.get("PYTHONPATH")) if p)
    return env


def time_import(stmt: str, src: Path | None, clock: str) -> float:
    """Seconds `stmt` takes in a new interpreter: wall-clock, or the process's CPU time
    (`clock` "cpu": what a busy shared host inflates least)."""
    done = subprocess.run([sys.executable, "-c", _TIMED.format(stmt=stmt)], env=env_for(src),
                          capture_output=True, text=True, timeout=300, check=True,
                          cwd=tempfile.gettempdir())  # not ROOT: no stray `tandem` on the path
    wall, cpu = done.stdout.strip().splitlines()[-1].split()
    return float(cpu if clock == "cpu" else wall)


def time_to_first_step(checkout: Path, steps: int, clock: str) -> float:
    """Seconds from the demo's command to its first step, in `checkout`; with `clock`
    "cpu", the command's CPU seconds instead, start to end (its few steps and its exit
    are the same work in both checkouts)."""
    with tempfile.TemporaryDirectory() as work:
        flags = ["--train.steps", str(steps), "--train.eval_every", "0", "--train.target", "",
                 "--checkpoint.every", "0", "--checkpoint.at_end", "false",
                 "--monitor.progress", "off", "--monitor.report", "false",
                 "--run.dir", work, "--run.name", "startup",
                 "--monitor.store", str(Path(work) / "tandem.db")]
        began = time.time()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, str(checkout / "examples" / "mnist1d_cnn.py"), *flags],
                       env=env_for(checkout / "src"), capture_output=True, text=True,
                       timeout=600, check=True, cwd=checkout)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = json.loads((Path(work) / "startup" / "summary.json").read_text())
    if clock == "cpu":
        return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return summary["train_started_at"] - began


def interval(diffs: list[float], level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the median of `diffs` (sign test): the k-th smallest
    and k-th largest, k the largest with P(Binomial(n, 1/2) < k) <= (1 - level) / 2."""
    n = len(diffs)
    ordered = sorted(diffs)
    k, tail = 0, 0.0
    while True:
        tail_next = tail + math.comb(n, k) / 2 ** n
        if tail_next > (1 - level) / 2:
            break
        tail, k = tail_next, k + 1
    if k == 0:  # too few rounds for this level: the whole range
        return ordered[0], ordered[-1]
    return ordered[k - 1], ordered[n - k]


def interleaved(arms: dict[str, object], rounds: int, measure: object) -> dict[str, list[float]]:
    """`measure(arm)` for every arm, `rounds` times, the order rotating from round to round."""
    names = list(arms)
    got: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            got[name].append(measure(arms[name]))  # type: ignore[operator]
        print(f"round {r + 1}: " + "  ".join(f"{n} {got[n][-1]:.3f} s" for n in names),
              flush=True)
    return got


def compare(got: dict[str, list[float]], pairs: list[tuple[str, str]]) -> None:
    """Medians per arm; the median paired difference and its interval per pair."""
    for name, values in got.items():
        print(f"{name:>8}: median {statistics.median(values):.3f} s over {len(values)} "
              f"(min {min(values):.3f}, max {max(values):.3f})")
    for a, b in pairs:
        diffs = [x - y for x, y in zip(got[a], got[b], strict=True)]
        low, high = interval(diffs)
        print(f"{a} - {b}: median {statistics.median(diffs):+.3f} s, 95% interval "
              f"[{low:+.3f}, {high:+.3f}] s")


def main() -> None:
    """Run the interleaved measurements and print them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--other", type=Path, default=None,
                        help="a second checkout (its src/ and examples/) to compare with")
    parser.add_argument("--startup-rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="what the import rounds time: wall-clock seconds, or the "
                             "interpreter's CPU seconds (steadier on a loaded host)")
    args = parser.parse_args()
    if args.rounds < 1 or args.startup_rounds < 0:
        raise SystemExit(f"--rounds {args.rounds} must be >= 1 and --startup-rounds "
                         f"{args.startup_rounds} >= 0")
    mine = ROOT / "src"
    arms: dict[str, object] = {"torch": ("torch", mine), "tandem": ("tandem", mine)}
    pairs = [("tandem", "torch")]
    if args.other is not None:
        arms["other"] = ("tandem", args.other / "src")
        pairs += [("other", "torch"), ("tandem", "other")]
    print(f"imports ({args.clock} time), {args.rounds} rounds ({os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f}):")
    got = interleaved(arms, args.rounds,
                      lambda arm: time_import(STATEMENTS[arm[0]], arm[1], args.clock))
    compare(got, pairs)
    if args.other is None or args.startup_rounds == 0:
        return
    what = ("to the first step" if args.clock == "wall"
            else f"CPU time of the whole command ({args.steps} steps)")
    print(f"\nstart-up {what}, mnist1d_cnn, one process, {args.startup_rounds} "
          f"rounds (load {os.getloadavg()[0]:.2f}):")
    starts = interleaved({"tandem": ROOT, "other": args.other}, args.startup_rounds,
                         lambda checkout: time_to_first_step(checkout, args.steps, args.clock))
    compare(starts, [("tandem", "other")])


if __name__ == "__main__":
    main()
