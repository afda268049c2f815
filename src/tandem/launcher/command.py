"""`tandem run`: turn launcher flags into the command that starts the workers.

On one node (the default) that is tandem's own agent (`tandem/launcher/local_agent.py`), which
starts the workers without importing torch first; across nodes, or with
`--launcher torchrun`, it is torchrun's agent (`tandem.launcher.torchrun_agent`).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

from tandem.status import ExitStatus, RunStatus
from tandem.trainer.guard import SAME_PRESS_S, STATUS_FILE_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's flags: torchrun's own, passed through."""
    parser.add_argument("--nproc-per-node", default="1",
                        help="processes on this node (an integer, or 'cpu'/'gpu'/'auto')")
    parser.add_argument("--nnodes", default="1", help="nodes, or MIN:MAX for elastic runs")
    parser.add_argument("--node-rank", default=None,
                        help="this node's rank: its processes get ranks node-rank x "
                             "nproc-per-node onwards (static rendezvous; without it, c10d "
                             "numbers the nodes itself)")
    parser.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    parser.add_argument("--rdzv-backend", default=None,
                        help="rendezvous backend: 'static' with --node-rank (node 0 serves "
                             "the store at the endpoint), else 'c10d' (elastic --nnodes "
                             "MIN:MAX; ranks by its own order, not by any flag)")
    parser.add_argument("--rdzv-id", default="tandem", help="job id shared by all nodes")
    parser.add_argument("--rdzv-conf", default=None,
                        help="rendezvous options, e.g. is_host=true on the node that serves "
                             "the c10d store when its hostname does not resolve to the "
                             "endpoint's address")
    parser.add_argument("--local-addr", default=None,
                        help="this node's address as the other nodes reach it")
    parser.add_argument("--launcher", choices=("auto", "torchrun"), default="auto",
                        help="what starts the workers: 'auto' (tandem's own agent on one "
                             "node with a numeric --nproc-per-node, torchrun's otherwise) "
                             "or 'torchrun' always")
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
                        help="the store to show (default: the one the run writes: "
                             "--monitor.store, else $TANDEM_STORE, else --run.dir's, "
                             "from the script's flags or --config)")
    parser.add_argument("script", help="the training script")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="the script's own flags (--section.field VALUE ...)")


def _check(ns: argparse.Namespace) -> None:
    if ns.max_restarts < 0:
        raise ValueError(f"--max-restarts: {ns.max_restarts} must be >= 0")
    if not os.path.isfile(ns.script):
        raise ValueError(f"script {ns.script!r} does not exist")
    if getattr(ns, "plan", None) and not os.path.isfile(ns.plan):
        raise ValueError(f"--plan {ns.plan!r} does not exist")


def uses_local_agent(ns: argparse.Namespace) -> bool:
    """Whether tandem's own agent starts the workers: one node, no rendezvous endpoint,
    a number of processes (not 'cpu'/'gpu'/'auto', which need torch to resolve)."""
    return (getattr(ns, "launcher", "auto") == "auto" and str(ns.nnodes) == "1"
            and ns.rdzv_endpoint is None and str(ns.nproc_per_node).isdigit())


def launch_command(ns: argparse.Namespace) -> list[str]:
    """The command line that runs the script as `ns` describes."""
    if not uses_local_agent(ns):
        return torchrun_command(ns)
    _check(ns)
    nproc = int(ns.nproc_per_node)
    if nproc < 1:
        raise ValueError(f"--nproc-per-node: {nproc} must be >= 1")
    from tandem.launcher import local_agent

    cmd = [sys.executable, str(Path(local_agent.__file__).resolve()),
           f"--nproc-per-node={nproc}", f"--max-restarts={ns.max_restarts}"]
    if ns.monitor_interval is not None:
        cmd.append(f"--monitor-interval={ns.monitor_interval}")
    worker = [sys.executable, "-u"]
    if getattr(ns, "observe", False):
        worker += ["-m", "tandem.observe"]
    return [*cmd, "--", *worker, ns.script, *ns.args]


def torchrun_command(ns: argparse.Namespace) -> list[str]:
    """The torchrun command line that runs the script as `ns` describes."""
    _check(ns)
    cmd = [sys.executable, "-m", "tandem.launcher.torchrun_agent",
           f"--nproc-per-node={ns.nproc_per_node}", f"--max-restarts={ns.max_restarts}"]
    single_node = str(ns.nnodes) == "1"
    if single_node and ns.rdzv_endpoint is None:
        # torchrun's --standalone, but bound to the loopback interface only: a
        # single-node job accepts no connection from another machine.
        cmd += ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                f"--rdzv-id={uuid.uuid4()}", "--local-addr=127.0.0.1"]
    else:
        if ns.rdzv_endpoint is None:
            raise ValueError("--rdzv-endpoint HOST:PORT is needed when --nnodes is not 1")
        backend = _rendezvous_backend(ns)
        cmd += [f"--nnodes={ns.nnodes}", f"--rdzv-backend={backend}",
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


def _rendezvous_backend(ns: argparse.Namespace) -> str:
    """'static' where --node-rank is given (torchrun's c10d rendezvous ignores it and
    numbers the nodes by its own order), else the backend asked for, else 'c10d'."""
    backend = ns.rdzv_backend or ("static" if ns.node_rank is not None else "c10d")
    if ns.node_rank is None:
        if backend == "static":
            raise ValueError("--rdzv-backend static needs --node-rank (0 on the node that "
                             "serves the rendezvous at --rdzv-endpoint)")
        return backend
    if backend != "static":
        raise ValueError(f"--node-rank {ns.node_rank}: the {backend} rendezvous ignores it "
                         "and numbers the nodes itself; drop --node-rank, or use "
                         "--rdzv-backend static")
    if not str(ns.nnodes).isdigit():
        raise ValueError(f"--nnodes {ns.nnodes}: --node-rank (a static rendezvous) needs a "
                         "fixed number of nodes; give MIN:MAX without --node-rank (c10d)")
    if not str(ns.node_rank).isdigit() or int(ns.node_rank) >= int(ns.nnodes):
        raise ValueError(f"--node-rank {ns.node_rank}: must be an integer in "
                         f"[0, {int(ns.nnodes) - 1}] for --nnodes {ns.nnodes}")
    return backend


def launch(ns: argparse.Namespace) -> int:
    """Run the job as a child process group; relay signals; return the job's exit status.

    SIGTERM (a preemption) and a first Ctrl-C reach the workers once, through the agent:
    they commit a checkpoint at the next step boundary and stop, with status 75 for a
    preemption and 130 for Ctrl-C; running the same command again continues the run. A
    second Ctrl-C kills the job at once (committed checkpoints stay intact). A usage
    error exits 2 with its one-line message only (handed over by the workers).
    """
    cmd = launch_command(ns)
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
        env = dict(os.environ, **{STATUS_FILE_ENV: str(status_file)})
        env.setdefault("OMP_NUM_THREADS", "1")
        if str(ns.nnodes) == "1" and ns.rdzv_endpoint is None:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only, as the rendezvous
        if getattr(ns, "plan", None):
            env["TANDEM_PLAN"] = str(Path(ns.plan).resolve())
        # Its own session: the terminal's Ctrl-C reaches this process only, which passes
        # it on once (the workers would otherwise get it from the terminal and again from
        # the agent).
        child = subprocess.Popen(cmd, env=env, start_new_session=True)
        code = _wait_relaying_signals(child)
        lines = status_file.read_text().splitlines() if status_file.exists() else []
    return _outcome(lines[0].split() if lines else [], code, lines[1] if len(lines) > 1 else "")


def _wait_relaying_signals(child: subprocess.Popen) -> int:
    presses: list[float] = []

    def relay(signum: int, frame: object) -> None:
        if signum == signal.SIGINT:
            presses.append(time.monotonic())
            if len(presses) > 1 and presses[-1] - presses[0] >= SAME_PRESS_S:
                print("tandem: second Ctrl-C: stopping the job now, without a checkpoint",
                      file=sys.stderr)
                _kill_tree(child.pid)
                return
            if len(presses) > 1:
                return
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, relay) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (found before any of them dies)."""
    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue


def _outcome(status: list[str], code: int, message: str = "") -> int:
    """The job's exit status, with a line saying how to go on where that helps (a usage
    error's `message`: the workers hand it over rather than print it, see fit.py)."""
    if status and status[0] == RunStatus.PREEMPTED:
        from tandem.sched.service.attempt import launcher_line  # the scheduler's stop, if it was

        print(launcher_line(int(status[1])) or
              f"tandem: preempted at step {status[1]}; the checkpoint is committed - run "
              "the same command again to continue", file=sys.stderr)
        return ExitStatus.PREEMPTED
    if status and status[0] == RunStatus.INTERRUPTED:
        print(f"tandem: interrupted at step {status[1]}; the checkpoint is committed - run "
              "the same command again to continue", file=sys.stderr)
        return ExitStatus.INTERRUPTED
    if status and status[0] == "usage":
        if message:
            print(f"tandem: error: {message}", file=sys.stderr)
        return ExitStatus.USAGE
    return code
