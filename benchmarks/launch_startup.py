"""Start-up of `tandem run` by launcher and by how its workers start, interleaved.

    python benchmarks/launch_startup.py [--pairs 6] [--nproc 2] [--example mnist1d_cnn]
                                        [--arms auto,torchrun]

Each round runs the same short job once per arm, the order rotating from round to round:

- `auto`: `tandem run` with tandem's one-node agent, each worker a new interpreter;
- `torchrun`: `--launcher torchrun`, torchrun's agent;
- `warm`: tandem's agent with the scheduler's fork server (`tandem/forking/server.py`, its
  default imports: torch, DCP, DTensor, dynamo, tandem), as the local backend runs it;
- `warm-imports`: the same with the example's own heavy import as well (`--warm-import`;
  MNIST-1D's `mnist1d.data`, which brings scipy).

The fork servers start once, before the first round. A run's start-up is the time from
the command's start to its training loop's 'segment' event in the run store (the moment
a resumed or resized job trains again, as the scheduler measures a resize); its total is
the command's wall time. Prints each run, then per arm the medians and the median of the
per-round differences from the first arm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _bench import QUIET, ROOT, RunStore, child_env, run_checked, tandem_command

from tandem.forking.wire import FORKSERVER_ENV
from tandem.sched.backends.local_backend import ForkServer

ARMS = ("auto", "torchrun", "warm", "warm-imports")
OWN_IMPORTS = {"mnist1d_cnn": ["mnist1d.data"], "char_lm": []}


def one(example: str, launcher: str, nproc: int, workdir: Path,
        extra_env: dict[str, str]) -> tuple[float, float]:
    """(start-up s, total s) of one short run."""
    store = workdir / "tandem.db"
    flags = [*QUIET, "--train.steps", "20", "--train.eval_every", "0", "--train.target", "",
             "--run.dir", str(workdir / "runs"), "--run.name", "startup",
             "--monitor.store", str(store)]
    cmd = tandem_command(["--launcher", launcher, "--nproc-per-node", str(nproc)],
                         ROOT / "examples" / f"{example}.py", flags)
    env = child_env(extra_env)
    if not extra_env:
        env.pop(FORKSERVER_ENV, None)  # a cold arm starts cold
    began = time.time()
    done = run_checked(cmd, timeout=300, env=env, what=f"{launcher} run")
    total = time.time() - began
    if "starts cold" in done.stderr:
        raise RuntimeError(f"a warm arm started cold:\n{done.stderr[-2000:]}")
    with RunStore(store) as s:
        events = s.events(s.run("startup")["run_id"])
    segment = min(e["time"] for e in events if e["kind"] == "segment")
    return segment - began, total


def fork_server(imports: list[str]) -> ForkServer:
    """The local backend's fork server, owned by this process, once it listens."""
    server = ForkServer(imports)
    deadline = time.monotonic() + 120
    while not server.ready():
        if server.gone() or time.monotonic() > deadline:
            server.close()
            raise RuntimeError("the fork server did not start")
        time.sleep(0.1)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=6, help="rounds (each runs every arm)")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--example", default="mnist1d_cnn", choices=sorted(OWN_IMPORTS))
    parser.add_argument("--arms", default="auto,torchrun",
                        help=f"comma-separated, the first the reference ({', '.join(ARMS)})")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if not set(arms) <= set(ARMS) or len(arms) < 2:
        parser.error(f"--arms: {args.arms!r}; need two or more of {', '.join(ARMS)}")
    servers: list[ForkServer] = []
    envs: dict[str, dict[str, str]] = {arm: {} for arm in arms}
    try:
        for arm in arms:
            if arm.startswith("warm"):
                server = fork_server(OWN_IMPORTS[args.example] if arm == "warm-imports" else [])
                servers.append(server)
                envs[arm] = {FORKSERVER_ENV: server.path}
        figures = rounds(args, arms, envs)
    finally:
        for server in servers:
            server.close()
    print()
    first = arms[0]
    for arm in arms:
        parts = []
        for i, what in enumerate(("start-up", "total")):
            mine = statistics.median(f[i] for f in figures[arm])
            parts.append(f"{what} median {mine:.2f} s")
            if arm != first:
                diff = [o[i] - a[i] for o, a in zip(figures[first], figures[arm], strict=True)]
                parts[-1] += (f" ({first} minus {arm} per round: median "
                              f"{statistics.median(diff):.2f} s, {min(diff):.2f} .. "
                              f"{max(diff):.2f})")
        print(f"{arm:<13} " + "; ".join(parts))


def rounds(args: argparse.Namespace, arms: list[str],
           envs: dict[str, dict[str, str]]) -> dict[str, list[tuple[float, float]]]:
    figures: dict[str, list[tuple[float, float]]] = {arm: [] for arm in arms}
    print(f"{args.example}, {args.nproc} processes, {args.pairs} rounds, load "
          f"{os.getloadavg()[0]:.1f}")
    print("round  arm            start-up s  total s")
    for pair in range(args.pairs):
        order = arms[pair % len(arms):] + arms[:pair % len(arms)]
        for arm in order:
            launcher = "torchrun" if arm == "torchrun" else "auto"
            with tempfile.TemporaryDirectory(prefix="tandem-startup-") as tmp:
                startup, total = one(args.example, launcher, args.nproc, Path(tmp), envs[arm])
            figures[arm].append((startup, total))
            print(f"{pair:>5}  {arm:<13}  {startup:>10.2f}  {total:>7.2f}", flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}")
    return figures


if __name__ == "__main__":
    main()
