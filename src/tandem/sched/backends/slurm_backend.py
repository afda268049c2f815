"""The Slurm backend: each job is one Slurm batch job, stopped by SIGTERM and requeued.

A tandem job gets one Slurm job for its whole life (`sbatch --requeue`), whose batch
script runs `tandem.sched.service.attempt --current JOB_DIR`: the attempt the scheduler prepared
last. Slurm does the placing:

- start: `sbatch --nodes 1 --ntasks 1 --cpus-per-task N` (`--gres gpu:N` on GPU nodes);
- stop: `scancel --signal TERM --batch` reaches the batch shell only, which is the
  attempt's shim, which passes it to `tandem run`: a committed checkpoint and exit 75
  (the Slurm job ends; `--signal B:TERM@60` does the same before a time limit);
- resize or resume: `scontrol requeuehold`, `scontrol update` to the new size (and a
  start time of now: Slurm delays requeued jobs by two minutes otherwise), `scontrol
  release`. Should Slurm requeue the job itself (its own preemption), the batch script
  finds its attempt already ended and exits at once; the scheduler relaunches it.

The job directory must be on a file system the nodes share (as the checkpoints must be).
A job runs within one node.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.sched.backends.backend import LaunchPlan, shim_command
from tandem.sched.policies.cluster import Cluster
from tandem.sched.service.attempt import CURRENT_FILE, write_atomic

log = logging.getLogger("tandem")
SLURM_FILE = "slurm.json"  # in the job directory: the Slurm job id of this tandem job
COMMAND_TIMEOUT_S = 60.0
LIVE_STATES = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
               "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING",
               "STAGE_OUT", "STOPPED")


def _run(*args: str) -> str:
    """Run a Slurm command; its stdout, or ValueError with its own message."""
    try:
        done = subprocess.run(list(args), capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ValueError(f"{args[0]}: {err}") from None
    if done.returncode != 0:
        raise ValueError(f"{' '.join(args[:3])}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class SlurmBackend:
    """Attempts as requeued runs of one Slurm batch job per tandem job."""

    name = "slurm"

    def __init__(self, partition: str | None = None) -> None:
        missing = [t for t in ("sbatch", "scontrol", "scancel", "sinfo")
                   if shutil.which(t) is None]
        if missing:
            raise ValueError(f"--backend slurm needs Slurm's commands; not found: {missing}")
        self.partition = partition
        self.gpus = False

    def cluster(self) -> Cluster:
        """The partition's nodes that can run jobs, by CPUs (or GPUs where nodes have them)."""
        args = ["sinfo", "-h", "-N", "-o", "%N %c %G %t"]
        if self.partition:
            args += ["-p", self.partition]
        nodes: dict[str, tuple[int, int]] = {}
        for line in _run(*args).splitlines():
            name, cpus, gres, state = (line.split() + ["", "", "", ""])[:4]
            if state.rstrip("*~#!%$@^-") in ("down", "drain", "drng", "fail", "maint"):
                continue
            found = re.search(r"gpu(?::[^:,()]+)?:(\d+)", gres)
            nodes[name] = (int(cpus), int(found.group(1)) if found else 0)
        if not nodes:
            where = f" in partition {self.partition}" if self.partition else ""
            raise ValueError(f"Slurm lists no usable node{where}")
        self.gpus = any(g for _, g in nodes.values())
        slots = [g if self.gpus else c for c, g in nodes.values()]
        return Cluster(nodes=len(slots), slots_per_node=max(1, min(slots)))

    def _job_id(self, job_dir: Path) -> str | None:
        try:
            return str(json.loads((job_dir / SLURM_FILE).read_text())["job_id"])
        except (OSError, ValueError, KeyError):
            return None

    def _size_args(self, procs: int) -> list[str]:
        return [f"NumCPUs={procs}", f"CPUsPerTask={procs}"] + (
            [f"Gres=gpu:{procs}"] if self.gpus else [])

    def launch(self, plan: LaunchPlan, spec: dict[str, Any]) -> dict[str, Any]:
        """Point the job at this attempt; requeue its Slurm job at the new size, or submit
        one the first time (or when Slurm has forgotten the old one)."""
        staged = plan.job_dir / f".{CURRENT_FILE}.tmp"
        staged.write_text(plan.attempt_dir.name)
        staged.replace(plan.job_dir / CURRENT_FILE)
        job_id = self._job_id(plan.job_dir)
        if job_id is not None:
            try:
                self._requeue(job_id, plan.procs)
                return {"slurm_job": job_id, "marker": plan.marker}
            except ValueError as err:
                log.info("slurm: job %s cannot be requeued (%s); submitting anew", job_id, err)
        job_id = self._submit(plan)
        write_atomic(plan.job_dir / SLURM_FILE, {"job_id": job_id})
        return {"slurm_job": job_id, "marker": plan.marker}

    def _requeue(self, job_id: str, procs: int) -> None:
        state = self.state(job_id)
        if state is None:
            raise ValueError("Slurm no longer knows it")
        if state not in ("PENDING", "REQUEUE_HOLD"):
            _run("scontrol", "requeuehold", job_id)
        _run("scontrol", "update", f"JobId={job_id}", *self._size_args(procs))
        _run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        _run("scontrol", "release", job_id)

    def _submit(self, plan: LaunchPlan) -> str:
        script = " ".join(shlex.quote(a) for a in [*shim_command(), "--current",
                                                    str(plan.job_dir)])
        args = ["sbatch", "--parsable", f"--job-name=tandem-{plan.job.job_id}",
                "--requeue", "--nodes=1", "--ntasks=1", f"--cpus-per-task={plan.procs}",
                "--signal=B:TERM@60", f"--output={plan.job_dir / 'slurm-%j.out'}",
                "--open-mode=append", f"--chdir={plan.job.cwd}", "--export=ALL",
                f"--wrap=exec {script}"]
        if self.gpus:
            args.append(f"--gres=gpu:{plan.procs}")
        if self.partition:
            args.append(f"--partition={self.partition}")
        return _run(*args).strip().split(";")[0]

    def state(self, job_id: str) -> str | None:
        """The Slurm job's state (None when Slurm no longer knows the job)."""
        try:
            out = _run("scontrol", "show", "job", "-o", job_id)
        except ValueError:
            return None
        found = re.search(r"\bJobState=(\S+)", out)
        held = re.search(r"\bReason=job_requeued_in_held_state\b", out)
        if found is None:
            return None
        return "REQUEUE_HOLD" if held and found.group(1) == "PENDING" else found.group(1)

    def find(self, marker: str, attempt_dir: Path) -> dict[str, Any] | None:
        """The handle of an attempt whose launch the service did not record."""
        job_id = self._job_id(attempt_dir.parent)
        current = attempt_dir.parent / CURRENT_FILE
        if job_id is None or not current.is_file() or \
                current.read_text().strip() != attempt_dir.name:
            return None
        return {"slurm_job": job_id, "marker": marker}

    def alive(self, handle: Mapping[str, Any]) -> bool:
        """Whether the Slurm job is pending or running (its batch script may still run)."""
        state = self.state(str(handle["slurm_job"]))
        return state is not None and state in LIVE_STATES and state != "REQUEUE_HOLD"

    def stop(self, handle: Mapping[str, Any]) -> None:
        """SIGTERM to the batch shell (the shim), which passes it to `tandem run`."""
        _run("scancel", "--signal=TERM", "--batch", str(handle["slurm_job"]))

    def kill(self, handle: Mapping[str, Any]) -> None:
        """End the Slurm job at once (Slurm kills every process of it)."""
        _run("scancel", str(handle["slurm_job"]))

    def release(self, handle: Mapping[str, Any]) -> None:
        """Nothing: the Slurm job stays known for the next requeue, or has ended."""

    def close(self) -> None:
        """Nothing to let go of."""
