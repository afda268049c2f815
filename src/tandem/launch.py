"""`tandem run`: turn launcher flags into a torchrun invocation."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from tandem.trainer.guard import PREEMPTED_EXIT_CODE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags: torchrun's own, passed through."""
    parser.add_argument("--nproc-per-node", default="1",
                        help="processes on this node (an integer, or 'cpu'/'gpu'/'auto')")
    parser.add_argument("--nnodes", default="1", help="nodes, or MIN:MAX for elastic runs")
    parser.add_argument("--node-rank", default=None, help="this node's rank (static rendezvous)")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    parser.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend")
    parser.add_argument("--rdzv-id", default="tandem", help="job id shared by all nodes")
    parser.add_argument("--rdzv-conf", default=None,
                        help="rendezvous options, e.g. is_host=true on the node that serves "
                             "the c10d store when its hostname does not resolve to the "
                             "endpoint's address")
    parser.add_argument("--local-addr", default=None,
                        help="this node's address as the other nodes reach it")
    parser.add_argument("--max-restarts", type=int, default=0,
                        help="times the group is restarted after a worker fails")
    parser.add_argument("--monitor-interval", default=None,
                        help="seconds between the launcher's checks of its workers")
    parser.add_argument("--observe", action="store_true",
                        help="observe an unmodified script (no tandem import): step time, "
                             "per-rank skew, memory and samples/s into runs/tandem.db")
    parser.add_argument("--plan", default=None,
                        help="a plan file (TOML, e.g. from `tandem tune`) applied over the "
                             "script's defaults and --config; the script's own flags still win")
    parser.add_argument("--dashboard", action="store_true",
                        help="serve the live dashboard on the run's store while it runs "
                             "(127.0.0.1; the URL is printed)")
    parser.add_argument("--dashboard-port", type=int, default=0,
                        help="the dashboard's port (default 0: a free one)")
    parser.add_argument("--dashboard-store", default=None,
                        help="the store to show (default: from --monitor.store / --run.dir "
                             "/ --config in the script's flags, else runs/tandem.db)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's own flags (--section.field VALUE ...)")


def torchrun_command(ns: argparse.Namespace) -> list[str]:
    """The torchrun command line that runs the script as `ns` describes."""
    if ns.max_restarts < 0:
        raise ValueError(f"--max-restarts: {ns.max_restarts} must be >= 0")
    if not os.path.isfile(ns.script):
        raise ValueError(f"script {ns.script!r} does not exist")
    if getattr(ns, "plan", None) and not os.path.isfile(ns.plan):
        raise ValueError(f"--plan {ns.plan!r} does not exist")
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
        if getattr(ns, "rdzv_conf", None):
            cmd.append(f"--rdzv-conf={ns.rdzv_conf}")
        if getattr(ns, "local_addr", None):
            cmd.append(f"--local-addr={ns.local_addr}")
    if ns.monitor_interval is not None:
        cmd.append(f"--monitor-interval={ns.monitor_interval}")
    if getattr(ns, "observe", False):
        return [*cmd, "-m", "tandem.observe", ns.script, *ns.args]
    return [*cmd, ns.script, *ns.args]


def launch(ns: argparse.Namespace) -> int:
    """Run torchrun as a child; forward SIGTERM/SIGINT; return the job's exit status.

    A run that stopped for preemption (its checkpoint committed) exits with 75
    (EX_TEMPFAIL): running the same command again continues it.
    """
    cmd = torchrun_command(ns)
    from tandem.dashboard.command import beside_run

    dashboard = beside_run(ns)
    try:
        return _launch(ns, cmd)
    finally:
        if dashboard is not None:
            dashboard.stop()


def _launch(ns: argparse.Namespace, cmd: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="tandem-launch-") as tmp:
        status_file = Path(tmp) / "status"
        env = dict(os.environ, TANDEM_STATUS_FILE=str(status_file))
        env.setdefault("OMP_NUM_THREADS", "1")
        if getattr(ns, "plan", None):
            env["TANDEM_PLAN"] = str(Path(ns.plan).resolve())
        child = subprocess.Popen(cmd, env=env)

        def forward(signum: int, frame: object) -> None:
            child.send_signal(signum)

        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            code = child.wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        status = status_file.read_text().split() if status_file.exists() else []
    if status and status[0] == "preempted":
        print(f"tandem: preempted at step {status[1]}; the checkpoint is committed - run "
              "the same command again to continue", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    return code
