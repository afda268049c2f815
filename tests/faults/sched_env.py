"""A scheduler service and its jobs as real processes, for the scheduler's end-to-end tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from tandem.sched.backends.backend import ATTEMPT_ENV
from tandem.sched.service.jobstore import SchedStore
from tandem.sched.service.sample_audit import Audit, audit, read_logs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "tests" / "faults" / "scripts" / "sched_toy.py")
TOY_SAMPLES = 200  # tests.dist.toy_task.N_SAMPLES
TOY_SEED = 0  # run.seed's default
# This checkout's tandem first, not whichever one the environment has installed.
PYTHONPATH = os.pathsep.join([str(ROOT / "src"), str(ROOT)])


class SchedEnv:
    """One store in a temporary directory, a service on it, and the jobs it runs."""

    def __init__(self, tmp: Path, extra_env: dict[str, str] | None = None) -> None:
        self.tmp = tmp
        self.extra_env = dict(extra_env or {})
        self.store = tmp / "runs" / "tandem.db"
        self.ids = tmp / "ids"
        self.service: subprocess.Popen | None = None
        self.service_log = tmp / "service.log"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of every command: the store, the repo importable, one thread."""
        out = dict(os.environ, TANDEM_STORE=str(self.store), PYTHONPATH=PYTHONPATH,
                   OMP_NUM_THREADS="1", **self.extra_env, **extra)
        for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
            out.pop(key, None)
        return out

    def tandem(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run one `tandem` command to its end."""
        return subprocess.run([sys.executable, "-m", "tandem.cli", *args], cwd=self.tmp,
                              env=self.env(), capture_output=True, text=True, timeout=timeout)

    def submit(self, *args: str, sleep: float = 0.002) -> str:
        """Submit the toy job (its sample ids logged); returns the job id."""
        done = self.tandem("submit", SCRIPT, *args, "--env", f"PYTHONPATH={PYTHONPATH}",
                           "--env", f"TOY_SAMPLE_SLEEP={sleep}",
                           "--env", f"TANDEM_SAMPLE_LOG={self.ids}")
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def start_service(self, *flags: str) -> None:
        """Start `tandem scheduler` in the background (its output in service.log)."""
        out = self.service_log.open("ab")
        self.service = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "scheduler", "--poll", "0.3", *flags],
            cwd=self.tmp, env=self.env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
        out.close()

    def kill_service(self) -> None:
        """SIGKILL the service (its jobs run on in their own sessions)."""
        assert self.service is not None
        self.service.send_signal(signal.SIGKILL)
        self.service.wait(timeout=10)
        self.service = None

    def stop_service(self) -> None:
        """SIGTERM the service and wait for it."""
        if self.service is None:
            return
        self.service.send_signal(signal.SIGTERM)
        try:
            self.service.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.service.kill()
            self.service.wait(timeout=10)
        self.service = None

    def job_processes(self) -> list[psutil.Process]:
        """Live processes of any attempt scheduled on this store."""
        prefix = f"{self.store}:"
        found = []
        for proc in psutil.process_iter(["pid"]):
            try:
                if proc.environ().get(ATTEMPT_ENV, "").startswith(prefix):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return found

    def cleanup(self) -> None:
        """Stop the service and kill every process of every attempt, pass or fail."""
        if self.service is not None:
            self.service.kill()
            self.service.wait(timeout=10)
            self.service = None
        procs = self.job_processes()
        for proc in procs:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        psutil.wait_procs(procs, timeout=10)

    def wait_for(self, what: str, check: Callable[[SchedStore], Any],
                 timeout: float) -> Any:
        """Poll the store until `check` returns something truthy; fail after `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with SchedStore(self.store) as store:
                found = check(store)
            if found:
                return found
            if self.service is not None and self.service.poll() is not None:
                raise AssertionError(f"the service exited ({self.service.returncode}) while "
                                     f"waiting for {what}:\n{self.log()}")
            time.sleep(0.3)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}:\n"
                             f"{self.log()}\n{self.tandem('queue', '--all').stdout}")

    def log(self) -> str:
        """The service's output so far."""
        return self.service_log.read_text(errors="replace")[-6000:]

    def audit(self, job_id: str) -> Audit:
        """The sample-id audit of one job."""
        return audit(read_logs(self.ids / job_id), TOY_SEED, TOY_SAMPLES)


def state_of(job_id: str) -> Callable[[SchedStore], str]:
    """A check that returns a job's state."""
    return lambda store: store.job(job_id).state


def trained(job_id: str, attempt: int, store_path: Path) -> Callable[[SchedStore], bool]:
    """A check: the job's `attempt` has logged a window in the run store."""
    from tandem.monitor.store import RunStore
    from tandem.sched.service.measured import read

    def check(store: SchedStore) -> bool:
        job = store.job(job_id)
        attempts = [a for a in store.attempts(job_id) if a.attempt == attempt]
        if not attempts:
            return False
        with RunStore(store_path) as runs:
            measured = read(runs, job.run_name)
        return measured.first_window(attempts[0].launched) is not None

    return check
