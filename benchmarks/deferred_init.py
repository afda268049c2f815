"""Building a large model under FSDP: eager construction against deferred initialisation.

Each contender builds the same stack of wide linear blocks on 2 processes under
`plan.strategy = fsdp`, with `plan.init = eager` (every process constructs the whole
model, then shards it) and `deferred` (meta construction, sharding, then each process
fills only its shards), interleaved over repeats. Printed per contender: the build time
and each process's peak resident memory while building (ru_maxrss, read right after the
build, so it is the build's peak), against the model's full and per-rank sizes.

    python benchmarks/deferred_init.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench import child_env

WIDTH, BLOCKS = 2048, 24


def worker(init: str, out: Path) -> None:
    """One rank: build the model as the plan says; write the time and peak RSS."""
    from torch import nn

    from tandem.config import PlanConfig
    from tandem.parallel import build_strategy
    from tandem.parallel.mesh import layout
    from tandem.runtime import start, stop

    plan = PlanConfig(strategy="fsdp", init=init)  # type: ignore[arg-type]
    runtime = start(plan)
    try:
        started = time.perf_counter()
        place = layout(1, runtime.rank, runtime.world_size, runtime.device)
        model = build_strategy(plan, runtime, place, seed=0).wrap(
            lambda: nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(BLOCKS))))
        seconds = time.perf_counter() - started
        local = sum(p.to_local().numel() * 4 for p in model.parameters())
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (out / f"{init}-{runtime.rank}.json").write_text(json.dumps(
            {"seconds": seconds, "peak_rss": peak, "local_bytes": local}))
    finally:
        stop(runtime)


def one_run(init: str, out: Path) -> list[dict]:
    """Both ranks' figures for one build."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node=2", __file__, "--worker", init, "--out", str(out)]
    subprocess.run(cmd, env=child_env(), check=True, capture_output=True, timeout=600)
    return [json.loads((out / f"{init}-{r}.json").read_text()) for r in range(2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.worker:
        worker(ns.worker, Path(ns.out))
        return
    full = BLOCKS * (WIDTH * WIDTH + WIDTH) * 4
    found: dict[str, list[dict]] = {"eager": [], "deferred": []}
    with tempfile.TemporaryDirectory(prefix="tandem-deferred-") as tmp:
        for rep in range(ns.repeats):
            for init in ("eager", "deferred") if rep % 2 == 0 else ("deferred", "eager"):
                found[init] += one_run(init, Path(tmp))
    print(f"{BLOCKS} x Linear({WIDTH}, {WIDTH}) under FSDP on 2 processes: {full / 2**20:.0f} "
          f"MiB of fp32 weights, {found['eager'][0]['local_bytes'] / 2**20:.0f} MiB per rank; "
          f"{ns.repeats} interleaved repeats")
    print(f"{'init':<10}{'build s (median)':>18}{'peak RSS MiB (median)':>24}")
    for init, rows in found.items():
        print(f"{init:<10}{statistics.median(r['seconds'] for r in rows):>18.2f}"
              f"{statistics.median(r['peak_rss'] for r in rows) / 2**20:>24.0f}")
    eager = statistics.median(r["peak_rss"] for r in found["eager"])
    deferred = statistics.median(r["peak_rss"] for r in found["deferred"])
    print(f"peak RSS while building, eager - deferred: {(eager - deferred) / 2**20:.0f} MiB "
          f"(the full model is {full / 2**20:.0f} MiB)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
