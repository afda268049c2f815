"""`tandem scheduler --backend local|ray|slurm`: start the live service in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from rich.console import Console

from tandem.monitor.store import add_store_argument, store_location
from tandem.sched.policies.policy import Policy

BACKENDS = ("local", "ray", "slurm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The service's flags, on `tandem scheduler` itself (beside its sub-commands)."""
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="where jobs run: this machine (local), a Ray cluster, Slurm")
    parser.add_argument("--policy", dest="service_policy", default="goodput",
                        choices=("fifo", "goodput", "tiresias"),
                        help="scheduling policy (default: goodput)")
    add_store_argument(parser)
    parser.add_argument("--interval", type=float, default=10.0,
                        help="seconds between decisions at most (default 10)")
    parser.add_argument("--poll", type=float, default=0.5,
                        help="seconds between checks of running jobs (default 0.5)")
    parser.add_argument("--stop-timeout", type=float, default=120.0,
                        help="seconds a graceful stop may take before a kill (default 120)")
    parser.add_argument("--restart-delay", type=float, default=15.0,
                        help="seconds a resize is assumed to cost until one has been "
                             "measured here (a job's own resizes, else any job's; "
                             "default 15)")
    parser.add_argument("--max-failures", type=int, default=3,
                        help="failed attempts a job survives, resumed each time (default 3)")
    parser.add_argument("--las-threshold", type=float, default=None,
                        help="tiresias: attained process-seconds that demote a job "
                             "(default 57600, 16 process-hours)")
    parser.add_argument("--min-run", type=float, default=30.0,
                        help="seconds a job trains after each (re)start before the policy "
                             "may stop or resize it again (default 30; one-node clusters)")
    parser.add_argument("--first-size", type=int, default=None,
                        help="goodput: processes a job gets before it has measured itself "
                             "(default 2)")
    parser.add_argument("--slots", type=int, default=None,
                        help="local: slots to hand out (default: GPUs, else CPU cores)")
    parser.add_argument("--warm-workers", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="local: fork workers from a process that has imported torch "
                             "(default; --no-warm-workers starts each one cold)")
    parser.add_argument("--warm-import", action="append", default=[], metavar="MODULE",
                        help="local: a module the warm process also imports (repeatable), "
                             "e.g. the jobs' own heavy imports")
    parser.add_argument("--ray-address", default=None,
                        help="ray: the cluster's address (default: $RAY_ADDRESS)")
    parser.add_argument("--partition", default=None, help="slurm: partition to submit to")
    parser.add_argument("--api-port", type=int, default=None,
                        help="serve the HTTP API on this port (0: any free port)")
    parser.add_argument("--api-host", default="127.0.0.1",
                        help="address of the API (default 127.0.0.1; any other address "
                             "requires a token: $TANDEM_SCHED_TOKEN, else printed at start)")


def make_policy(name: str, las_threshold: float | None = None,
                first_size: int | None = None, min_run: float = 30.0) -> Policy:
    """The named policy (the object the simulator also runs), runs pinned for `min_run`."""
    from tandem.sched import POLICIES, GoodputPolicy, TiresiasPolicy
    from tandem.sched.policies.pinning import Pinned

    if name == "goodput" and first_size is not None:
        inner: Policy = GoodputPolicy(first_size=first_size)
    elif name == "tiresias" and las_threshold is not None:
        if las_threshold <= 0:
            raise ValueError(f"--las-threshold: {las_threshold}; need > 0 process-seconds")
        inner = TiresiasPolicy(thresholds=(las_threshold,))
    else:
        inner = POLICIES[name]()
    return Pinned(inner, min_run)


def make_backend(ns: argparse.Namespace) -> Any:
    """The chosen backend, connected to its engine."""
    if ns.backend == "local":
        from tandem.sched.backends.local_backend import LocalBackend

        return LocalBackend(ns.slots, warm=ns.warm_workers, warm_imports=ns.warm_import)
    if ns.backend == "ray":
        from tandem.sched.backends.ray_backend import RayBackend

        return RayBackend(ns.ray_address or os.environ.get("RAY_ADDRESS"))
    from tandem.sched.backends.slurm_backend import SlurmBackend

    return SlurmBackend(ns.partition)


def serve(ns: argparse.Namespace, console: Console) -> int:
    """Run the service until SIGTERM or Ctrl-C; running jobs keep running afterwards."""
    from tandem.sched.service.service import Service, ServiceLock, ServiceOptions

    _log_to_stderr()
    store = store_location(ns.store)
    options = ServiceOptions(interval_s=ns.interval, poll_s=ns.poll,
                             stop_timeout_s=ns.stop_timeout, max_failures=ns.max_failures,
                             restart_delay_s=ns.restart_delay)
    policy = make_policy(ns.service_policy, ns.las_threshold, ns.first_size, ns.min_run)
    store.parent.mkdir(parents=True, exist_ok=True)
    lock = ServiceLock(store)
    api = None
    try:
        backend = make_backend(ns)
        service = Service(store, backend, policy, options)
        cluster = service.cluster
        facts = (f"pid {os.getpid()} on {socket.gethostname()}, backend {backend.name} "
                 f"({cluster.nodes} x {cluster.slots_per_node} slots), policy {policy.name}, "
                 f"since {time.strftime('%Y-%m-%d %H:%M:%S')}")
        if ns.api_port is not None:
            from tandem.sched.service.api import Api

            api = Api(store, ns.api_host, ns.api_port)
            api.start()
            facts += f", API {api.url}"
        service.store.set_service_value("service", facts)
        console.print(f"tandem scheduler: {facts}; store {store}")
        if api is not None and api.token:
            console.print(f"API token: {api.token}")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        try:
            service.run(stop)
        finally:
            service.close()
        console.print("tandem scheduler: stopped (running jobs go on; start the service "
                      "again to keep scheduling them)")
    finally:
        if api is not None:
            api.close()
        lock.release()
    return 0


def _log_to_stderr() -> None:
    log = logging.getLogger("tandem")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[tandem scheduler %(asctime)s] %(message)s",
                                               "%H:%M:%S"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
