"""What a run records about itself: the execution plan in force and its outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tandem.config import Config
from tandem.data.batches import BatchPlan
from tandem.monitor.system import process_times
from tandem.parallel.mesh import Layout
from tandem.parallel.strategy import Strategy
from tandem.trainer.evaluations import Evaluations
from tandem.trainer.precision import Precision
from tandem.trainer.state import Progress


def plan_of(cfg: Config, strategy: Strategy, layout: Layout, batches: BatchPlan,
            precision: Precision, world_size: int, device: torch.device) -> dict[str, Any]:
    """The execution plan in force: how the work is spread and computed."""
    return {
        **strategy.describe(),
        "world_size": world_size,
        "data_parallel": layout.dp_size,
        "tensor_parallel": layout.tp_size,
        "micro_batch": batches.micro,
        "accumulation": batches.accum,
        "batch_ramp": cfg.train.batch_ramp,
        "activation_checkpointing": cfg.plan.activation_checkpointing,
        "compile": cfg.plan.compile,
        "init": cfg.plan.init,
        "precision": cfg.precision.mode,
        "attention": precision.attention,  # 'auto' resolved for this device
        "data_workers": cfg.data.workers,
        "device": str(device),
    }


def summary_of(run_dir: Path, step: int, cfg: Config, world_size: int, batches: BatchPlan,
               progress: Progress, evaluations: Evaluations, calibration_s: float,
               percentiles: dict[str, float], tokens_per_sample: int | None,
               started_at: float | None, data_load_s: float = 0.0) -> dict[str, Any]:
    """The run's outcome as JSON-ready values."""
    summary: dict[str, Any] = {
        "name": run_dir.name,
        "steps": step,
        "world_size": world_size,
        "global_batch": cfg.train.global_batch,
        "micro_batch": batches.micro,
        "accumulation": batches.accum,
        "wall_time_s": progress.elapsed_s,
        **process_times(started_at),
        "eval_time_s": evaluations.seconds,
        "calibration_s": calibration_s,
        "samples_per_s": progress.samples / progress.train_s if progress.train_s else 0.0,
        **percentiles,
        **evaluations.last,
    }
    if cfg.data.in_memory:  # part of startup_s: what reading the data up front cost
        summary["data_load_s"] = data_load_s
    if tokens_per_sample:
        summary["tokens_per_s"] = summary["samples_per_s"] * tokens_per_sample
    if started_at is not None:  # this attempt's first step (time.time())
        summary["train_started_at"] = started_at
    reached = progress.target_reached
    if reached is not None:
        summary["time_to_target_s"] = reached["elapsed_s"]
        if "evaluated_s" in reached:
            summary["time_to_target_end_s"] = reached["evaluated_s"]
        summary["target"] = f"{cfg.train.target} at step {reached['step']}"
    elif evaluations.target is not None:
        summary["target"] = f"{cfg.train.target} not reached"
    summary["run_dir"] = str(run_dir)
    return summary
