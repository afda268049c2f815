"""Scheduling policies in simulation, set beside the published Pollux / Tiresias figures.

Runs every policy over the 8 shipped workloads at each job load on 16 nodes x 4 GPUs,
prints mean JCT per load (ours, published, ratio), the per-workload averages, and the
wall time of each simulated workload.

    python benchmarks/sched_sim.py                       # all policies, all loads
    python benchmarks/sched_sim.py --loads 1.0 --policies tiresias goodput --procs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tandem.sched.service.command import PUBLISHED, run_workload  # noqa: E402

TRACES = ROOT / "data" / "pollux-traces"
WORKLOADS = [f"workload-{i}" for i in range(1, 9)]


def _one(args: tuple[str, str, float]) -> tuple[str, str, float, float, float, int]:
    policy, workload, load = args
    result, _ = run_workload(policy, workload, load=load, traces=TRACES)
    return policy, workload, load, result.mean_jct, result.wall_s, result.restarts


def _published(name: str, load: float) -> dict[str, float]:
    path = TRACES / "results-jobload" / f"{name}-{load}" / "summary.json"
    return json.loads(path.read_text())["avgs"] if path.is_file() else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=["fifo", "tiresias", "goodput"])
    parser.add_argument("--loads", nargs="+", type=float, default=[0.5, 1.0, 1.5, 2.0])
    parser.add_argument("--procs", type=int, default=1,
                        help="workloads simulated at once (each on one core)")
    parser.add_argument("--out", type=Path, default=None, help="write all figures as JSON")
    ns = parser.parse_args()
    tasks = [(p, w, load) for load in ns.loads for p in ns.policies for w in WORKLOADS]
    with ProcessPoolExecutor(max_workers=ns.procs) as pool:
        rows = list(pool.map(_one, tasks))
    means = {(p, w, load): m for p, w, load, m, _, _ in rows}
    print("## Mean JCT over the 8 workloads (seconds)\n")
    print("| load | policy | ours | published (same policy) | ours / published | "
          "restarts per workload |")
    print("| --- | --- | --- | --- | --- | --- |")
    for load in ns.loads:
        for p in ns.policies:
            ours = statistics.mean(means[p, w, load] for w in WORKLOADS)
            pub = _published(PUBLISHED.get(p, ""), load) if p in PUBLISHED else {}
            ref = statistics.mean(pub.values()) if pub else None
            restarts = statistics.mean(r for q, _, ld, _, _, r in rows if q == p and ld == load)
            label = f"{PUBLISHED[p]} {ref:.0f}" if ref else "-"
            ratio = f"{ours / ref:.3f}" if ref else "-"
            print(f"| {load} | {p} | {ours:.0f} | {label} | {ratio} | {restarts:.0f} |")
    for load in ns.loads:
        print(f"\n## Per workload at {load}x: ours / published (mean JCT, s)\n")
        print("| workload | " + " | ".join(ns.policies) + " |")
        print("| --- |" + " --- |" * len(ns.policies))
        for w in WORKLOADS:
            cells = []
            for p in ns.policies:
                pub = _published(PUBLISHED[p], load).get(w) if p in PUBLISHED else None
                ours = means[p, w, load]
                cells.append(f"{ours:.0f} / {pub:.0f} ({ours / pub:.3f})" if pub
                             else f"{ours:.0f}")
            print(f"| {w} | " + " | ".join(cells) + " |")
    print("\n## Wall time per simulated workload (s)\n")
    print("| load | policy | min | median | max |")
    print("| --- | --- | --- | --- | --- |")
    for load in ns.loads:
        for p in ns.policies:
            walls = [s for q, _, ld, _, s, _ in rows if q == p and ld == load]
            print(f"| {load} | {p} | {min(walls):.1f} | {statistics.median(walls):.1f} | "
                  f"{max(walls):.1f} |")
    if ns.out:
        ns.out.write_text(json.dumps([dict(zip(
            ("policy", "workload", "load", "mean_jct", "wall_s", "restarts"), r, strict=True))
            for r in rows], indent=1))


if __name__ == "__main__":
    main()
