"""The figures the scaling model needs, read from one run in the run store."""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from tandem.analyze.report.figures import Metric, by_name
from tandem.analyze.scaling.model import RunFigures
from tandem.monitor.catalogue import (
    COMM_ALLREDUCE_RATE,
    COMM_BUCKETS_PER_STEP,
    COMM_BYTES_PER_STEP,
    COMM_LATENCY,
    MEM_GRAD,
    SAMPLES_PER_S,
    SYS_CPU,
    SYS_PROCESS_CPU,
    TIME_BACKWARD,
    TIME_COMM_EXPOSED,
    TIME_COMPUTE,
    TIME_DATA,
    TIME_H2D,
    TIME_OPTIM,
    TIME_STEP,
    TIME_SYNC_WAIT,
)
from tandem.monitor.store import RunStore
from tandem.parallel.registry import DDP, SINGLE

# Plans whose step the model describes: one replica per rank, gradients all-reduced.
MODELLED_STRATEGIES = (SINGLE.name, DDP.name)


def _job(groups: Mapping[str, Sequence[Metric]], name: str) -> dict[int, float]:
    """step -> the job-wide (rank -1) value of a metric."""
    return {int(r["step"]): float(r["value"]) for r in groups.get(name, ()) if r["rank"] == -1}


def steady_steps(groups: Mapping[str, Sequence[Metric]], calibrate_at: int) -> list[int]:
    """The windows (by their last step) that hold neither warm-up nor the one-time
    calibration: the first window and the one containing step `calibrate_at` are left
    out while at least three windows remain."""
    steps = sorted(_job(groups, TIME_STEP))
    keep = steps[1:] if len(steps) >= 4 else steps
    if calibrate_at > 0:
        later = [s for s in keep if s > calibrate_at]
        first_after = next((s for s in steps if s >= calibrate_at), None)
        trimmed = [s for s in later if s != first_after] if first_after in later else later
        if len(trimmed) >= 3:
            keep = trimmed
    return keep


def _median_at(groups: Mapping[str, Sequence[Metric]], name: str, steps: Sequence[int],
               default: float | None = None) -> float | None:
    values = _job(groups, name)
    found = [values[s] for s in steps if s in values and math.isfinite(values[s])]
    return median(found) if found else default


def _per_window(groups: Mapping[str, Sequence[Metric]], name: str,
                steps: Sequence[int]) -> list[float]:
    values = _job(groups, name)
    return [values[s] for s in steps if s in values and math.isfinite(values[s])]


def _check_plan(run: Mapping[str, Any]) -> None:
    plan, config = run.get("plan") or {}, run.get("config") or {}
    strategy = plan.get("strategy", SINGLE.name)
    if strategy not in MODELLED_STRATEGIES:
        raise ValueError(f"plan.strategy {strategy!r}: the scaling model describes "
                         f"{' and '.join(MODELLED_STRATEGIES)} runs only")
    if int(plan.get("tensor_parallel", 1) or 1) != 1:
        raise ValueError(f"plan.tp {plan.get('tensor_parallel')}: the scaling model "
                         "describes data parallelism only (tp = 1)")
    if (config.get("train") or {}).get("batch_ramp"):
        raise ValueError("train.batch_ramp: a run whose batch changes cannot be scaled "
                         "(its steps differ); use a run without a ramp")


def _shared_memory(plan: Mapping[str, Any], config: Mapping[str, Any], device: str) -> bool:
    """Whether the run's gradients went through the host's shared memory; for a
    one-process run, whether they would at more processes (plan.host_allreduce)."""
    if "allreduce" in plan:
        return plan["allreduce"] == "shared_memory"
    settings = config.get("plan") or {}  # runs made before the option: the backend
    return (device == "cpu" and settings.get("host_allreduce", "backend") != "backend"
            and settings.get("comm_hook", "none") == "none"
            and platform.machine().lower() in ("x86_64", "amd64"))


def figures_from_run(run: Mapping[str, Any], metrics: Sequence[Metric],
                     cores: int | None = None) -> RunFigures:
    """RunFigures from a stored run and its metric rows (`cores`: the machine's, default
    the core count the run recorded, else this machine's)."""
    _check_plan(run)
    groups = by_name(metrics)
    config, plan, env = run.get("config") or {}, run.get("plan") or {}, run.get("env") or {}
    monitor = config.get("monitor") or {}
    steps = steady_steps(groups, int(monitor.get("calibrate_at", 0) or 0))
    if not steps:
        raise ValueError(f"run {run.get('run_id')!r} has no logging windows to model")

    def at(name: str, default: float | None = 0.0) -> float | None:
        return _median_at(groups, name, steps, default)

    world = int(env.get("world_size") or plan.get("world_size") or 1)
    device = "cuda" if str(plan.get("device", "cpu")).startswith("cuda") else "cpu"
    host = [v / 100.0 for v in _per_window(groups, SYS_CPU, steps)]
    proc = [v / 100.0 for v in _per_window(groups, SYS_PROCESS_CPU, steps)]
    if len(host) != len(proc):
        host, proc = [], []
    train = config.get("train") or {}
    return RunFigures(
        run_id=str(run.get("run_id", "")), world_size=world,
        global_batch=int(train.get("global_batch") or plan.get("micro_batch", 1) * world),
        micro_batch=int(plan.get("micro_batch") or train.get("global_batch", 1) // world),
        micro_batch_setting=int(train.get("micro_batch") or 0), device=device,
        cores=int(cores or env.get("cpu_count") or os.cpu_count() or 1),
        devices=int(env.get("device_count") or 0) if device == "cuda" else 0,
        step_s=at(TIME_STEP) or 0.0, compute_s=at(TIME_COMPUTE) or 0.0,
        backward_s=at(TIME_BACKWARD) or 0.0,
        data_s=(at(TIME_DATA) or 0.0) + (at(TIME_H2D) or 0.0),
        optim_s=at(TIME_OPTIM) or 0.0, comm_exposed_s=at(TIME_COMM_EXPOSED) or 0.0,
        sync_wait_s=at(TIME_SYNC_WAIT) or 0.0, samples_per_s=at(SAMPLES_PER_S) or 0.0,
        grad_bytes=at(MEM_GRAD) or 0.0,
        comm_hook=str(plan.get("comm_hook", "none")),
        shared_memory=_shared_memory(plan, config, device),
        bucket_bytes=float(plan.get("bucket_mb", 25.0)) * 2**20,
        bytes_per_step=at(COMM_BYTES_PER_STEP, None),
        buckets_per_step=at(COMM_BUCKETS_PER_STEP, None),
        latency_s=at(COMM_LATENCY, None),
        allreduce_bytes_per_s=at(COMM_ALLREDUCE_RATE, None),
        host_cpu=tuple(host), process_cpu=tuple(proc))


def run_figures(store_path: str | Path, run: str, cores: int | None = None) -> RunFigures:
    """RunFigures of `run` (id, name or id prefix) in the run store at `store_path`."""
    path = Path(store_path)
    if not path.exists():
        raise ValueError(f"--store {path}: no run store there")
    with RunStore(path) as store:
        found = store.run(run)
        metrics = store.metrics(found["run_id"])
    return figures_from_run(found, metrics, cores)

