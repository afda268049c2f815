"""The live scheduler: the store's jobs, a policy, a backend, and a loop that joins them.

Each tick (every `poll_s`):

1. reconcile: every open attempt is checked (its exit status in the attempt directory
   first, then the backend's view of it); an ended one moves its job on (lifecycle.py);
2. carry out what is pending: graceful stops for cancellations, relaunches at the size a
   resize chose, launches the last decision allowed once their slots are free, a hard
   kill for a stop that timed out;
3. decide, when something changed (a job arrived or ended) or `interval_s` passed and no
   job is between sizes: the policy (the same object the simulator runs) gets every
   active job's view and returns sizes; a running job whose size changes is stopped
   gracefully and relaunched at its new size (tandem's own resume: DCP reshards, the
   sample cursor continues), a queued job given slots is launched.

All state is in the store; the service holds none that a restart would lose: started
again after a kill -9, it adopts the attempts that still run (by pid, Ray actor, Slurm
job id) and launches nothing that already runs (a job has at most one open attempt, and
the run directory's lease refuses a second launch anyway).
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tandem.monitor.store import RunStore
from tandem.sched.backends.backend import Backend, LaunchPlan, attempt_spec, describe
from tandem.sched.policies.policy import Policy
from tandem.sched.service import lifecycle
from tandem.sched.service.attempt import (
    EXIT_FILE,
    SHIM_FILE,
    SPEC_FILE,
    STOP_FILE,
    read_json,
    write_atomic,
)
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.measured import read
from tandem.sched.service.records import ACTIVE, Attempt, JobRecord
from tandem.sched.service.views import DEFAULT_RESTART_DELAY_S, JobState, choose_batch
from tandem.status import HOLDING_JOB_STATES, AttemptOutcome, JobStatus

log = logging.getLogger("tandem")
MAX_FAILED_TICKS = 20


@dataclass(frozen=True, kw_only=True)
class ServiceOptions:
    """How the service runs."""

    interval_s: float = 10.0
    """Longest time between two decisions (sooner when a job arrives or ends)."""
    poll_s: float = 0.5
    """Time between two checks of the attempts."""
    stop_timeout_s: float = 120.0
    """A graceful stop not done after this long is turned into a kill (steps are redone)."""
    lost_grace_s: float = 10.0
    """An attempt the backend no longer knows, whose heartbeat stopped, gets this long to
    write its exit status before it is taken as lost."""
    max_failures: int = 3
    """Non-graceful ends a job survives (each resumed from its checkpoint)."""
    restart_delay_s: float = DEFAULT_RESTART_DELAY_S
    """Seconds a resize is assumed to cost a job before it has measured one of its own."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "poll_s", "stop_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: {getattr(self, name)} is not allowed; need > 0")
        if self.restart_delay_s < 0:
            raise ValueError(f"restart_delay_s: {self.restart_delay_s}; need >= 0")
        if self.max_failures < 0:
            raise ValueError(f"max_failures: {self.max_failures}; need >= 0")


def sched_dir(store: Path) -> Path:
    """Where job directories go: beside the store, in `sched/`."""
    return store.parent / "sched"


class ServiceLock:
    """One service per store: an exclusive flock on `<store>.sched.lock` (freed by the
    kernel when the holder dies, so a killed service leaves no stale lock)."""

    def __init__(self, store: Path) -> None:
        self.path = store.with_name(store.name + ".sched.lock")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            holder = self.path.read_text().strip() or "another process"
            raise ValueError(f"a scheduler service already runs on {store} ({holder}); "
                             "one service per store") from None
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())

    def release(self) -> None:
        """Let another service take the store."""
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


class Service:
    """The scheduling loop over one store with one backend and one policy."""

    def __init__(self, store_path: Path, backend: Backend, policy: Policy,
                 options: ServiceOptions | None = None) -> None:
        self.store_path = store_path
        self.backend, self.policy = backend, policy
        self.options = options or ServiceOptions()
        self.store = SchedStore(store_path)
        self.runs = RunStore(store_path)
        self.cluster = backend.cluster()
        self.jobs_dir = sched_dir(store_path)
        self.intents: dict[str, tuple[int, int | None]] = {}  # job -> (procs, batch)
        self.last_decision = 0.0
        self.last_sizes: dict[str, int] = {}
        self.seen: tuple[int, int] = (-1, -1)  # (jobs submitted, jobs done) last decided on
        self.lost_since: dict[tuple[str, int], float] = {}
        self.stops_sent: set[tuple[str, int]] = set()  # (job, attempt) told to stop

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event) -> None:
        """Tick until `stop` is set (running jobs keep running afterwards).

        A tick that fails (a locked store, an engine command that timed out) is logged
        and the next one tries again; the service gives up only after
        MAX_FAILED_TICKS failures in a row.
        """
        self.recover()
        failed = 0
        while not stop.is_set():
            try:
                self.tick()
                failed = 0
            except Exception:
                failed += 1
                log.exception("scheduler tick failed (%d in a row)", failed)
                if failed >= MAX_FAILED_TICKS:
                    raise
            stop.wait(self.options.poll_s)

    def close(self) -> None:
        """Close the store connections and let go of the backend."""
        self.backend.close()
        self.store.close()
        self.runs.close()

    def tick(self) -> None:
        """One round: reconcile, carry out what is pending, decide when due."""
        now = time.time()
        self.reconcile(now)
        self.carry_out(now)
        if self.decision_due(now):
            self.decide(now)
            self.carry_out(time.time())
        self.complete_records()

    def recover(self) -> None:
        """After a (re)start: find every open attempt again; resend pending stops."""
        for attempt in self.store.attempts(open_only=True):
            job = self.store.job(attempt.job_id)
            handle = attempt.handle or self._handle_from_disk(job, attempt)
            if handle is None:
                log.warning("%s attempt %d never started (the service stopped while "
                            "launching it); it goes back to the queue", job.job_id,
                            attempt.attempt)
                self.store.close_attempt(job.job_id, attempt.attempt, None, "never-started",
                                         time.time())
                self.store.update_job(job.job_id, ACTIVE, state=JobStatus.QUEUED, procs=0)
                continue
            if not attempt.handle:
                self.store.set_handle(job.job_id, attempt.attempt, handle)
            adopt = getattr(self.backend, "adopt", None)
            if adopt is not None:
                adopt(handle)
            log.info("adopted %s attempt %d (%s)", job.job_id, attempt.attempt, describe(handle))

    def _handle_from_disk(self, job: JobRecord, attempt: Attempt) -> dict | None:
        """Ask the backend for an attempt launched just before the service stopped."""
        plan = LaunchPlan(job=job, attempt=attempt.attempt, procs=attempt.procs,
                          batch=attempt.batch, store=self.store_path, job_dir=self.job_dir(job))
        return self.backend.find(plan.marker, plan.attempt_dir)

    def job_dir(self, job: JobRecord) -> Path:
        """The job's directory of attempts (spec, log, exit status)."""
        return self.jobs_dir / job.job_id

    # ------------------------------------------------------------------ reconcile
    def reconcile(self, now: float) -> None:
        """Close every attempt that ended and move its job on."""
        for attempt in self.store.attempts(open_only=True):
            job = self.store.job(attempt.job_id)
            attempt_dir = self.job_dir(job) / f"attempt-{attempt.attempt}"
            status = read_json(attempt_dir / EXIT_FILE)
            if status is not None:
                self._ended(job, attempt, int(status["code"]), float(status["ended"]))
                continue
            if (not attempt.handle or self.backend.alive(attempt.handle)
                    or self._beating(attempt_dir, now)):
                self.lost_since.pop((job.job_id, attempt.attempt), None)
                continue
            key = (job.job_id, attempt.attempt)
            first = self.lost_since.setdefault(key, now)
            if now - first >= self.options.lost_grace_s:  # its status never came
                self.lost_since.pop(key)
                self.backend.kill(attempt.handle)
                self._ended(job, attempt, None, now)

    def _beating(self, attempt_dir: Path, now: float) -> bool:
        """Whether the attempt's shim touched its heartbeat lately (it runs, whatever the
        backend says: e.g. a job finishing its graceful stop after its actor died)."""
        try:
            return now - (attempt_dir / SHIM_FILE).stat().st_mtime < self.options.lost_grace_s
        except OSError:
            return False

    def _ended(self, job: JobRecord, attempt: Attempt, code: int | None, ended: float) -> None:
        self.backend.release(attempt.handle)
        log_path = self.job_dir(job) / f"attempt-{attempt.attempt}" / "log.txt"
        state = lifecycle.settle(self.store, job, attempt, code, ended,
                                 self.options.max_failures, log_path)
        log.info("%s attempt %d ended (%s, exit %s): %s", job.job_id, attempt.attempt,
                 lifecycle.outcome_of(code, attempt.stop_requested is not None), code, state)
        if state == JobStatus.QUEUED and attempt.stop_requested is None:
            # Not asked to stop (a failure, another's preemption): resumed at the next
            # decision, which records how long training was lost.
            self.store.record_resize(lifecycle.stop_record(job, attempt, "recover", ended,
                                                           0, None))
        self.intents.pop(job.job_id, None)

    # ------------------------------------------------------------------ pending work
    def held(self) -> int:
        """Slots held by open attempts."""
        return sum(a.procs for a in self.store.attempts(open_only=True))

    def carry_out(self, now: float) -> None:
        """Cancellations, overdue stops, relaunches after resizes, launches that now fit."""
        open_attempts = {a.job_id: a for a in self.store.attempts(open_only=True)}
        for job in self.store.jobs(HOLDING_JOB_STATES):
            attempt = open_attempts.get(job.job_id)
            if attempt is None:
                continue
            if job.cancel_requested and job.state == JobStatus.RUNNING:
                self.store.request_stop(job.job_id, attempt.attempt, "cancel", 0, None, now)
            elif job.cancel_requested and (job.job_id, attempt.attempt) in self.stops_sent:
                self._note_stop(job, attempt, "cancel")  # cancelled while stopping
            elif (job.state == JobStatus.STOPPING and attempt.stop_requested is not None
                  and now - attempt.stop_requested > self.options.stop_timeout_s):
                log.warning("%s did not stop within %.0f s: killing it", job.job_id,
                            self.options.stop_timeout_s)
                self.backend.kill(attempt.handle)
        self.deliver_stops()
        free = self.cluster.capacity - self.held()
        for job in self.store.jobs((JobStatus.STOPPING,)):  # resized: relaunch at the new size
            if job.job_id in open_attempts or not job.target_procs:
                continue
            if job.cancel_requested:
                self.store.update_job(job.job_id, (JobStatus.STOPPING,), state=JobStatus.CANCELLED,
                                      finished=now, message="cancelled between sizes")
                continue
            if job.target_procs <= free and self.launch(job, job.target_procs,
                                                        job.target_batch):
                free -= job.target_procs
        for job_id, (procs, batch) in list(self.intents.items()):
            job = self.store.job(job_id)
            if job.state != JobStatus.QUEUED or job.cancel_requested:
                self.intents.pop(job_id)
            elif procs <= free:
                self.intents.pop(job_id)
                if self.launch(job, procs, batch):
                    free -= procs

    def deliver_stops(self) -> None:
        """Send each stopping job's attempt its graceful stop, once, as soon as it can be a
        graceful one: its shim is up to relay it and its job has started training (before
        that, neither the launcher nor the ranks turn SIGTERM into a commit yet). After a
        restart every pending stop is sent again: a second SIGTERM is harmless."""
        open_attempts = {a.job_id: a for a in self.store.attempts(open_only=True)}
        for job in self.store.jobs((JobStatus.STOPPING,)):
            attempt = open_attempts.get(job.job_id)
            if attempt is None or (job.job_id, attempt.attempt) in self.stops_sent:
                continue
            shim = (self.job_dir(job) / f"attempt-{attempt.attempt}" / SHIM_FILE).is_file()
            trained = read(self.runs, job.run_name).first_window(attempt.launched) is not None
            if shim and trained:
                self._note_stop(job, attempt,
                                "cancel" if job.cancel_requested else job.stop_reason)
                try:
                    self.backend.stop(attempt.handle)
                except ValueError as err:  # it ended meanwhile: reconcile will see it
                    log.warning("%s: stop not delivered: %s", job.job_id, err)
                self.stops_sent.add((job.job_id, attempt.attempt))

    def _note_stop(self, job: JobRecord, attempt: Attempt, reason: str | None) -> None:
        """Tell the attempt why it stops (its shim and launcher say so in its log)."""
        path = self.job_dir(job) / f"attempt-{attempt.attempt}" / STOP_FILE
        if (read_json(path) or {}).get("reason") != reason:
            write_atomic(path, {"reason": reason, "to_procs": job.target_procs})

    def launch(self, job: JobRecord, procs: int, batch: int | None) -> bool:
        """Start the job's next attempt at `procs` processes; False if it could not."""
        number = max((a.attempt for a in self.store.attempts(job.job_id)), default=0) + 1
        plan = LaunchPlan(job=job, attempt=number, procs=procs, batch=batch,
                          store=self.store_path, job_dir=self.job_dir(job))
        plan.attempt_dir.mkdir(parents=True, exist_ok=True)
        spec = attempt_spec(plan)
        write_atomic(plan.attempt_dir / SPEC_FILE, spec)
        record = Attempt(job_id=job.job_id, attempt=number, backend=self.backend.name,
                         procs=procs, batch=batch, launched=time.time())
        if not self.store.open_attempt(job.job_id, record, procs, batch):
            return False
        try:
            handle = self.backend.launch(plan, spec)
        except Exception as err:  # the engine refused: the job cannot run there
            log.error("%s: launch failed: %s", job.job_id, err)
            self.store.close_attempt(job.job_id, number, None, AttemptOutcome.LAUNCH_FAILED,
                                     time.time())
            self.store.update_job(job.job_id, (JobStatus.RUNNING,), state=JobStatus.FAILED,
                                  procs=0, finished=time.time(),
                                  message=f"launch failed: {err}")
            return False
        self.store.set_handle(job.job_id, number, handle)
        log.info("%s: attempt %d on %d processes%s", job.job_id, number, procs,
                 f", global batch {batch}" if batch else "")
        return True

    # ------------------------------------------------------------------ decide
    def decision_due(self, now: float) -> bool:
        """A job arrived or ended, or the interval passed; and no job is between sizes."""
        if self.store.jobs((JobStatus.STOPPING,)):
            return False
        jobs = self.store.jobs()
        seen = (len(jobs), sum(1 for j in jobs if j.state not in ACTIVE))
        queued = any(j.state == JobStatus.QUEUED for j in jobs)
        changed = seen != self.seen
        return changed or (now - self.last_decision >= self.options.interval_s
                           and (queued or any(j.state == JobStatus.RUNNING for j in jobs)))

    def states(self) -> list[JobState]:
        """Every active job that is not being cancelled, with what it measured."""
        delays = self._restart_delays()
        # A job that has not been resized yet is assumed to cost what resizes of the other
        # jobs here measured (the same machine, the same launcher); before any, the option.
        measured = [d for job_delays in delays.values() for d in job_delays]
        default = statistics.median(measured) if measured else self.options.restart_delay_s
        out = []
        for job in self.store.jobs((JobStatus.QUEUED, JobStatus.RUNNING)):
            if job.cancel_requested:
                continue
            out.append(JobState(record=job, attempts=self.store.attempts(job.job_id),
                                measured=read(self.runs, job.run_name),
                                restart_delays=delays.get(job.job_id, ()),
                                default_restart_delay=default))
        return out

    def _restart_delays(self) -> dict[str, list[float]]:
        delays: dict[str, list[float]] = {}
        for row in self.store.resizes():
            if row["kind"] == "resize" and row.get("training_again"):
                delays.setdefault(row["job_id"], []).append(
                    row["training_again"] - row["decided"])
        return delays

    def decide(self, now: float) -> None:
        """Ask the policy for sizes and turn the changes into stops and launch intents."""
        jobs = self.store.jobs()
        self.seen = (len(jobs), sum(1 for j in jobs if j.state not in ACTIVE))
        self.last_decision = now
        states = self.states()
        if not states:
            return
        epoch = self.store.epoch()
        views = [s.view(epoch, now, self.cluster) for s in states]
        try:
            allocations = self.policy.allocate(views, self.cluster, now - epoch)
        except ValueError as err:  # e.g. a rigid policy given jobs another one resized
            log.error("policy %s cannot decide: %s; running jobs go on, waiting jobs wait",
                      self.policy.name, err)
            return
        sizes = {v.job_id: len(allocations.get(v.job_id, ())) for v in views}
        changes: dict[str, str] = {}
        self.intents = {}
        open_attempts = {a.job_id: a for a in self.store.attempts(open_only=True)}
        for state, view in zip(states, views, strict=True):
            job, size = state.record, sizes[view.job_id]
            if job.state == JobStatus.RUNNING and size != job.procs:
                attempt = open_attempts[job.job_id]
                batch = choose_batch(state, view, size, self.cluster) if size else None
                kind = "preempt" if size == 0 else "resize"
                if self.store.request_stop(job.job_id, attempt.attempt, kind, size, batch, now):
                    self.store.record_resize(lifecycle.stop_record(job, attempt, kind, now,
                                                                   size, batch))
                    changes[job.job_id] = f"{kind} {job.procs} -> {size}"
            elif job.state == JobStatus.QUEUED and size:
                self.intents[job.job_id] = (size, choose_batch(state, view, size,
                                                               self.cluster))
                changes[job.job_id] = f"start on {size}"
        if sizes != self.last_sizes or changes:
            self.store.record_decision(self.policy.name, self.backend.name, sizes, changes)
            self.last_sizes = sizes

    def complete_records(self) -> None:
        """Fill in the stop records from what the attempts and run store now tell."""
        for row in self.store.resizes():
            if row.get("closed"):
                continue
            job = self.store.job(row["job_id"])
            new = lifecycle.complete_record(row, self.store.attempts(job.job_id),
                                            read(self.runs, job.run_name),
                                            job.state not in ACTIVE)
            if new is not None:
                self.store.record_resize(new)
