"""`tandem submit | queue | cancel | logs`: the scheduler's jobs from the command line.

Each command reads or writes the store directly, so each works with or without the
service running (a submitted job waits in the queue until a service picks it up).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tandem.monitor.store import RunStore, add_store_argument, store_location
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.measured import attempt_rates, read
from tandem.sched.service.records import ACTIVE, Attempt, JobRecord
from tandem.sched.service.service import sched_dir
from tandem.sched.service.submit import USAGE, split_argv, submit
from tandem.status import HOLDING_JOB_STATES, JobStatus
from tandem.tables import print_fitted


def add_arguments(sub: argparse._SubParsersAction) -> None:
    """The `queue`, `cancel` and `logs` parsers, and `submit`'s (parsed by hand: its
    options may come before or after the script's own flags)."""
    sub.add_parser("submit", help="queue a training script for the scheduler; prints its id",
                   add_help=False).add_argument("argv", nargs=argparse.REMAINDER)
    queue = sub.add_parser("queue", help="the scheduler's jobs: state, size, samples/s ...")
    queue.add_argument("--all", action="store_true", help="finished jobs too")
    _store(queue)
    cancel = sub.add_parser("cancel", help="cancel a job (a running one stops gracefully)")
    cancel.add_argument("job", help="job id (j3 or 3)")
    _store(cancel)
    logs = sub.add_parser("logs", help="the output of a job's attempts")
    logs.add_argument("job", help="job id (j3 or 3)")
    logs.add_argument("--attempt", type=int, default=None, help="one attempt only")
    logs.add_argument("--tail", type=int, default=0, help="last N lines of each attempt")
    _store(logs)


def _store(parser: argparse.ArgumentParser) -> None:
    add_store_argument(parser)


def _existing(given: str | None) -> Path:
    path = store_location(given)
    if not path.is_file():
        raise ValueError(f"--store: no run store at {str(path)!r}; `tandem submit` creates one")
    return path


def submit_main(argv: list[str]) -> int:
    """`tandem submit ...`: store the job, print its id."""
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    request = split_argv(argv)
    job = submit(request, store_location(request.store))
    print(job.job_id)
    return 0


def run(ns: argparse.Namespace, console: Console) -> int:
    """Run `queue`, `cancel` or `logs`."""
    if ns.command == "queue":
        queue(_existing(ns.store), ns.all, console)
    elif ns.command == "cancel":
        with SchedStore(_existing(ns.store)) as store:
            print(store.cancel(ns.job))
    elif ns.command == "logs":
        return logs(_existing(ns.store), ns.job, ns.attempt, ns.tail)
    return 0


def queued_for(job: JobRecord, attempts: list[Attempt], now: float) -> float:
    """Seconds the job has waited for slots: before its first start and between attempts
    that it did not run (a relaunch right after a resize counts its stop and restart)."""
    waited, since = 0.0, job.submitted
    for attempt in attempts:
        waited += max(0.0, attempt.launched - since)
        since = attempt.ended if attempt.ended is not None else float("inf")
    if job.state == JobStatus.QUEUED and since != float("inf"):
        waited += max(0.0, now - since)
    return waited


def queue(store_path: Path, show_all: bool, console: Console) -> None:
    """Print the jobs with their size, measured samples/s and goodput, and waits."""
    now = time.time()
    with SchedStore(store_path) as store, RunStore(store_path) as runs:
        jobs = store.jobs(None if show_all else ACTIVE)
        table = Table(title=f"jobs in {store_path}")
        for column in ("job", "name", "state", "procs", "batch", "samples/s", "goodput",
                       "queued s", "attempts", "note"):
            table.add_column(column, justify="right" if column in (
                "procs", "batch", "samples/s", "goodput", "queued s", "attempts") else "left")
        for job in jobs:
            attempts = store.attempts(job.job_id)
            measured = read(runs, job.run_name)
            base = measured.base_batch or 0
            batch = job.batch or base
            rate = measured.latest_rate() if job.state in HOLDING_JOB_STATES else None
            goodput = (rate * measured.efficiency(base).efficiency(batch)
                       if rate is not None and base else None)
            rates = attempt_rates(measured, attempts, base or 1)
            size = f"{job.procs} [{job.min_procs}:{job.max_procs}]"
            note = job.message or (f"-> {job.target_procs} ({job.stop_reason})"
                                   if job.state == JobStatus.STOPPING else "")
            if not rate and rates:
                note = note or "measured " + ", ".join(
                    f"{p}p: {r:,.0f}/s" for (p, _), r in sorted(rates.items()))
            table.add_row(job.job_id, job.name, job.state, size, str(batch or "-"),
                          f"{rate:,.0f}" if rate else "-",
                          f"{goodput:,.0f}" if goodput else "-",
                          f"{queued_for(job, attempts, now):.0f}", str(len(attempts)),
                          note)
        print_fitted(console, table, drop=("batch", "queued s", "attempts", "goodput"),
                     spill=("note",))
        service = store.service_value("service")
        console.print(f"service: {service}" if service else
                      "service: none has run on this store yet (`tandem scheduler`)")


def logs(store_path: Path, job_id: str, only: int | None, tail: int) -> int:
    """Print each attempt's output, with a header naming the attempt."""
    with SchedStore(store_path) as store:
        job = store.job(job_id)
        attempts = store.attempts(job.job_id)
    if not attempts:
        print(f"{job.job_id} has not run yet ({job.state})")
        return 0
    for attempt in attempts:
        if only is not None and attempt.attempt != only:
            continue
        path = sched_dir(store_path) / job.job_id / f"attempt-{attempt.attempt}" / "log.txt"
        ended = (f"exit {attempt.exit_code} ({attempt.outcome})" if attempt.ended
                 else JobStatus.RUNNING)
        print(f"==> {job.job_id} attempt {attempt.attempt}: {attempt.procs} processes, "
              f"{ended}, {path} <==")
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError as err:
            print(f"(no log: {err.strerror})")
            continue
        sys.stdout.write("\n".join(lines[-tail:] if tail else lines) + "\n")
    return 0
