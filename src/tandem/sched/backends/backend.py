"""What the service asks of a backend, and the one command every backend runs.

A backend places attempts on an existing engine (this machine's process table, a Ray
cluster, Slurm); it does not schedule: the policy decides the sizes, the backend finds
the slots and starts, signals and forgets attempts. Every attempt is the same command,
`tandem run --nproc-per-node N SCRIPT FLAGS --run.name R --run.dir D --monitor.store S`,
run through `tandem.sched.service.attempt` (which records its exit status in the attempt
directory), so that a stop is always tandem's own graceful one (SIGTERM to the launcher:
a committed checkpoint and exit 75) and a relaunch at any size is tandem's own resume.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from tandem.sched.policies.cluster import Cluster
from tandem.sched.service import attempt as attempt_module
from tandem.sched.service.records import JobRecord

ATTEMPT_ENV = "TANDEM_SCHED_ATTEMPT"  # job_id/attempt: marks every process of an attempt
JOB_ENV = "TANDEM_SCHED_JOB"
ALLOW_CHANGES = "run.allow_changes"


@dataclass(frozen=True)
class LaunchPlan:
    """One attempt to start: which job, how large, where its files go."""

    job: JobRecord
    attempt: int
    procs: int
    batch: int | None
    """Global batch the scheduler chose (None: the job's own)."""
    store: Path
    job_dir: Path

    @property
    def attempt_dir(self) -> Path:
        """Spec, log, pid and exit status of this attempt."""
        return self.job_dir / f"attempt-{self.attempt}"

    @property
    def log_path(self) -> Path:
        """Where the attempt's output goes."""
        return self.attempt_dir / "log.txt"

    @property
    def marker(self) -> str:
        """The value of ATTEMPT_ENV in every process of this attempt."""
        return f"{self.store}:{self.job.job_id}/{self.attempt}"


class Backend(Protocol):
    """Starts, stops and finds attempts on one engine."""

    name: str

    def cluster(self) -> Cluster:
        """The slots the policy may hand out (nodes x slots per node)."""
        ...

    def launch(self, plan: LaunchPlan, spec: dict[str, Any]) -> dict[str, Any]:
        """Start the attempt whose spec is written in `plan.attempt_dir`; return its handle."""
        ...

    def find(self, marker: str, attempt_dir: Path) -> dict[str, Any] | None:
        """The handle of an attempt the service started but did not record (it stopped
        in between); None when the attempt never started."""
        ...

    def alive(self, handle: Mapping[str, Any]) -> bool:
        """Whether the attempt may still be running (False only when it surely is not)."""
        ...

    def stop(self, handle: Mapping[str, Any]) -> None:
        """Ask the attempt to stop gracefully (its launcher gets SIGTERM: commit, exit 75)."""
        ...

    def kill(self, handle: Mapping[str, Any]) -> None:
        """Stop the attempt at once, every process of it (after a stop timed out)."""
        ...

    def release(self, handle: Mapping[str, Any]) -> None:
        """Give back what the engine holds for an attempt that has ended."""
        ...

    def close(self) -> None:
        """Let go of the engine (running attempts keep running)."""
        ...


def describe(handle: Mapping[str, Any]) -> str:
    """A handle as a person reads it: `pid 123 on host-a`, `Ray actor NAME`, `Slurm job
    42`; any other keys as `key value` pairs (the marker, internal, left out)."""
    if handle.get("pid") is not None:
        host = f" on {handle['host']}" if handle.get("host") else ""
        gpus = handle.get("gpus")
        return f"pid {handle['pid']}{host}" + (f", GPUs {','.join(map(str, gpus))}"
                                                if gpus else "")
    if handle.get("actor"):
        return f"Ray actor {handle['actor']}"
    if handle.get("slurm_job") is not None:
        return f"Slurm job {handle['slurm_job']}"
    rest = [f"{key} {value}" for key, value in handle.items() if key != "marker"]
    return ", ".join(rest) or "no handle"


def shim_command() -> list[str]:
    """How a host starts `tandem.sched.service.attempt`: by file, so that no package import (and
    with it no torch import) delays the launch."""
    return [sys.executable, str(Path(attempt_module.__file__).resolve())]


def with_flag(args: list[str], key: str, value: str) -> list[str]:
    """`args` with `--key value` set (replacing any earlier `--key` / `--key=`)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == f"--{key}":
            i += 2
            continue
        if arg.startswith(f"--{key}="):
            i += 1
            continue
        out.append(arg)
        i += 1
    return [*out, f"--{key}", value]


def flag_value(args: list[str], key: str) -> str | None:
    """The last value given to `--key` in `args` (None when absent)."""
    found = None
    for i, arg in enumerate(args):
        if arg == f"--{key}" and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(f"--{key}="):
            found = arg.split("=", 1)[1]
    return found


def job_command(plan: LaunchPlan) -> list[str]:
    """The `tandem run` command line of one attempt."""
    job = plan.job
    args = list(job.args)
    args = with_flag(args, "run.name", job.run_name)
    args = with_flag(args, "run.dir", job.run_dir)
    args = with_flag(args, "monitor.store", str(plan.store))
    if plan.batch is not None:
        args = with_flag(args, "train.global_batch", str(plan.batch))
        allowed = [k for k in (flag_value(args, ALLOW_CHANGES) or "").split(",") if k]
        if "train.global_batch" not in allowed and "all" not in allowed:
            allowed.append("train.global_batch")
        args = with_flag(args, ALLOW_CHANGES, ",".join(allowed))
    return [sys.executable, "-m", "tandem.cli", "run", "--nproc-per-node", str(plan.procs),
            "--max-restarts", "0", job.script, *args]


def attempt_spec(plan: LaunchPlan, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What `tandem.sched.service.attempt` runs: command, directory, environment."""
    return {"command": job_command(plan), "cwd": plan.job.cwd,
            "env": {**plan.job.env, **(env or {}), JOB_ENV: plan.job.job_id,
                    ATTEMPT_ENV: plan.marker, "OMP_NUM_THREADS":
                        plan.job.env.get("OMP_NUM_THREADS", "1")},
            "procs": plan.procs, "batch": plan.batch,
            "attempt": plan.attempt}


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes on this host that belong to the attempt with `marker`."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if (proc.environ().get(ATTEMPT_ENV) == marker
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def kill_marked(marker: str, timeout: float = 10.0) -> int:
    """SIGKILL every process of one attempt on this host; returns how many there were."""
    procs = marked_processes(marker)
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(procs, timeout=timeout)
    return len(procs)
