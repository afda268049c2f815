"""Workloads: which jobs arrive when (CSV), by path or by name in the shipped traces."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from tandem.sched.policies.cluster import Cluster
from tandem.sched.policies.job import JobSpec
from tandem.sched.simulation.traces import TraceApplication

LOADS = {0.5: "workloads-0.5", 1.0: "workloads", 1.5: "workloads-1.5", 2.0: "workloads-2.0"}

# Applications an elastic policy still runs at their requested size and batch, as in the
# published Pollux comparison (ncf's requested batch is already its largest measured one).
FIXED_UNDER_ELASTIC = frozenset({"ncf"})


@dataclass(frozen=True)
class WorkloadJob:
    """One row of a workload CSV: `name, time, application, num_replicas, batch_size`."""

    name: str
    time: float
    application: str
    num_replicas: int
    batch_size: int


def default_traces_dir() -> Path:
    """`data/pollux-traces` of this source tree, or of the current directory."""
    for root in (Path(__file__).resolve().parents[4], Path.cwd()):
        candidate = root / "data" / "pollux-traces"
        if candidate.is_dir():
            return candidate
    raise ValueError("traces: data/pollux-traces not found next to the package or in the "
                     "current directory; pass --traces DIR")


def resolve(workload: str, load: float, traces_dir: Path) -> Path:
    """A workload CSV from a path, or from a name (`workload-3`, `3`) at a load factor."""
    path = Path(workload)
    if path.is_file():
        return path
    if load not in LOADS:
        raise ValueError(f"--load: {load} has no shipped workloads; allowed: "
                         f"{', '.join(str(k) for k in LOADS)}")
    name = workload if workload.startswith("workload-") else f"workload-{workload}"
    candidate = traces_dir / LOADS[load] / f"{name}.csv"
    if not candidate.is_file():
        names = sorted(p.stem for p in (traces_dir / LOADS[load]).glob("*.csv"))
        raise ValueError(f"--workload: {workload!r} is neither a file nor one of {names}")
    return candidate


def read_workload(path: Path) -> list[WorkloadJob]:
    """The jobs of a workload CSV, in file order."""
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    need = {"name", "time", "application", "num_replicas", "batch_size"}
    if rows and not need <= set(rows[0]):
        raise ValueError(f"workload {path}: columns {sorted(rows[0])}; need {sorted(need)}")
    return [WorkloadJob(r["name"], float(r["time"]), r["application"],
                        int(r["num_replicas"]), int(r["batch_size"])) for r in rows]


def job_specs(jobs: list[WorkloadJob], apps: dict[str, TraceApplication], *, elastic: bool,
              cluster: Cluster) -> list[JobSpec]:
    """JobSpecs for a policy: rigid at the requested size, or elastic with batch adaptation.

    Elastic jobs accept 1 to as many processes as their largest batch can feed (at most
    the cluster) and start from the application's base batch, as in the published
    comparison; rigid ones keep the workload's processes and batch.
    """
    specs = []
    for job in jobs:
        if job.application not in apps:
            raise ValueError(f"workload job {job.name!r}: application {job.application!r} "
                             f"has no traces; known: {sorted(apps)}")
        app = apps[job.application]
        if not elastic or job.application in FIXED_UNDER_ELASTIC:
            specs.append(JobSpec(job_id=job.name, submit_time=job.time,
                                 min_procs=job.num_replicas, max_procs=job.num_replicas,
                                 batch_size=job.batch_size, limits=app.limits,
                                 application=job.application))
            continue
        most = min(cluster.capacity, app.limits.max_batch // app.limits.min_local)
        specs.append(JobSpec(job_id=job.name, submit_time=job.time, min_procs=1,
                             max_procs=max(1, most), batch_size=app.base_batch,
                             adapt_batch=True, limits=app.limits, application=job.application))
    return specs
