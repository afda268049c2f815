"""`tandem scheduler ...`: the live service (`--backend ...`) and the simulator (`simulate`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from tandem.sched.simulation.simulator import SimResult

# Kept literal so that building the `tandem` parser imports nothing heavy.
POLICY_NAMES = ("fifo", "goodput", "tiresias")
LOAD_NAMES = ("0.5", "1.0", "1.5", "2.0")
# The published simulation each policy is set beside (results-jobload/<name>-<load>).
PUBLISHED = {"tiresias": "tiresias", "goodput": "pollux"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Sub-commands of `tandem scheduler`; the live service's `--backend` mode sits beside."""
    from tandem.sched.service.serve import add_arguments as service_arguments

    service_arguments(parser)
    sub = parser.add_subparsers(dest="sched_command", required=False)
    sim = sub.add_parser("simulate", help="replay a workload against measured traces")
    sim.add_argument("--policy", choices=POLICY_NAMES, default="goodput",
                     help="scheduling policy (default: goodput)")
    sim.add_argument("--workload", required=True,
                     help="a workload CSV, or a shipped one by name (workload-1 ... workload-8)")
    sim.add_argument("--load", type=float, default=1.0,
                     help=f"job load of a named workload: {', '.join(LOAD_NAMES)}")
    sim.add_argument("--nodes", type=int, default=16, help="nodes in the cluster (16)")
    sim.add_argument("--gpus-per-node", type=int, default=4, help="slots per node (4)")
    sim.add_argument("--interval", type=float, default=60.0,
                     help="seconds between scheduling decisions (60)")
    sim.add_argument("--restart-delay", type=float, default=30.0,
                     help="seconds a job loses at each restart or resize (30)")
    sim.add_argument("--traces", type=Path, default=None,
                     help="folder of the traces (default: data/pollux-traces)")
    sim.add_argument("--json", action="store_true", help="print the result as JSON")


def run(ns: argparse.Namespace, console: Console) -> int:
    """Run the chosen `tandem scheduler` sub-command."""
    if ns.sched_command == "simulate":
        return _simulate(ns, console)
    if ns.sched_command is None:
        from tandem.sched.service.serve import serve

        return serve(ns, console)
    raise ValueError(f"scheduler: unknown sub-command {ns.sched_command!r}")


def run_workload(policy: str, workload: str, *, load: float = 1.0, nodes: int = 16,
                 gpus_per_node: int = 4, interval: float = 60.0, restart_delay: float = 30.0,
                 traces: Path | None = None) -> tuple[SimResult, Path]:
    """Simulate one workload under a named policy; returns the result and the CSV used."""
    from tandem.sched import POLICIES
    from tandem.sched.policies.cluster import Cluster
    from tandem.sched.simulation.simulator import simulate
    from tandem.sched.simulation.traces import load_applications
    from tandem.sched.simulation.workload import (
        default_traces_dir,
        job_specs,
        read_workload,
        resolve,
    )

    if policy not in POLICIES:
        raise ValueError(f"--policy: {policy!r} is not one of {sorted(POLICIES)}")
    traces = traces or default_traces_dir()
    cluster = Cluster(nodes=nodes, slots_per_node=gpus_per_node)
    apps = load_applications(traces)
    path = resolve(workload, load, traces)
    specs = job_specs(read_workload(path), apps, elastic=policy == "goodput", cluster=cluster)
    return simulate(specs, apps, POLICIES[policy](), cluster, interval=interval,
                    restart_delay=restart_delay), path


def published_mean(traces: Path, policy: str, load: float, workload: str) -> float | None:
    """The published average JCT of the comparable policy on a shipped workload, if any."""
    name = PUBLISHED.get(policy)
    summary = traces / "results-jobload" / f"{name}-{load}" / "summary.json"
    if name is None or not summary.is_file():
        return None
    return json.loads(summary.read_text())["avgs"].get(workload)


def _simulate(ns: argparse.Namespace, console: Console) -> int:
    from tandem.sched.simulation.workload import default_traces_dir

    traces = ns.traces or default_traces_dir()
    result, path = run_workload(ns.policy, ns.workload, load=ns.load, nodes=ns.nodes,
                                gpus_per_node=ns.gpus_per_node, interval=ns.interval,
                                restart_delay=ns.restart_delay, traces=traces)
    published = None
    if (ns.nodes, ns.gpus_per_node, ns.interval, ns.restart_delay) == (16, 4, 60.0, 30.0):
        if path.resolve().is_relative_to(traces.resolve()):
            published = published_mean(traces, ns.policy, ns.load, path.stem)
    if ns.json:
        print(json.dumps({**result.to_json(), "workload": str(path), "load": ns.load,
                          "published_mean_jct": published}, indent=2))
        return 0
    table = Table(title=f"{ns.policy} on {path.stem} (load {ns.load}, "
                        f"{ns.nodes} x {ns.gpus_per_node})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("jobs completed", str(len(result.jcts))),
            ("mean JCT (s)", f"{result.mean_jct:.0f}"),
            (f"published mean JCT, {PUBLISHED.get(ns.policy)} (s)",
             f"{published:.0f}" if published else "-"),
            ("ours / published", f"{result.mean_jct / published:.3f}" if published else "-"),
            ("makespan (s)", f"{result.makespan:.0f}"),
            ("restarts (resizes, moves, resumptions)", str(result.restarts)),
            ("resizes", str(result.resizes)),
            ("preemptions", str(result.preemptions)),
            ("simulation wall time (s)", f"{result.wall_s:.1f}")]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    return 0
