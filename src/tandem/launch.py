"""`tandem run`: turn launcher flags into a torchrun invocation."""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags: torchrun's own, passed through."""
    parser.add_argument("--nproc-per-node", default="1",
                        help="processes on this node (an integer, or 'cpu'/'gpu'/'auto')")
    parser.add_argument("--nnodes", default="1", help="nodes, or MIN:MAX for elastic runs")
    parser.add_argument("--node-rank", default=None, help="this node's rank (static rendezvous)")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    parser.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend")
    parser.add_argument("--rdzv-id", default="tandem", help="job id shared by all nodes")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="times the group is restarted after a worker fails")
    parser.add_argument("--monitor-interval", default=None,
                        help="seconds between the launcher's checks of its workers")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's own flags (--section.field VALUE ...)")


def torchrun_command(ns: argparse.Namespace) -> list[str]:
    """The torchrun command line that runs the script as `ns` describes."""
    if ns.max_restarts < 0:
        raise ValueError(f"--max-restarts: {ns.max_restarts} must be >= 0")
    if not os.path.isfile(ns.script):
        raise ValueError(f"script {ns.script!r} does not exist")
    cmd = [sys.executable, "-m", "torch.distributed.run",
           f"--nproc-per-node={ns.nproc_per_node}", f"--max-restarts={ns.max_restarts}"]
    single_node = str(ns.nnodes) == "1"
    if single_node and ns.rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if ns.rdzv_endpoint is None:
            raise ValueError("--rdzv-endpoint HOST:PORT is needed when --nnodes is not 1")
        cmd += [f"--nnodes={ns.nnodes}", f"--rdzv-backend={ns.rdzv_backend}",
                f"--rdzv-endpoint={ns.rdzv_endpoint}", f"--rdzv-id={ns.rdzv_id}"]
        if ns.node_rank is not None:
            cmd.append(f"--node-rank={ns.node_rank}")
    if ns.monitor_interval is not None:
        cmd.append(f"--monitor-interval={ns.monitor_interval}")
    return [*cmd, ns.script, *ns.args]


def launch(ns: argparse.Namespace) -> None:
    """Replace this process with torchrun, so signals reach the launcher directly."""
    cmd = torchrun_command(ns)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    os.execve(cmd[0], cmd, env)
