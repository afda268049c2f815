"""`tandem.fit`: the one call a training script makes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tandem.analyze.scaling import scaling_figures
from tandem.config import Config, load, parse_args, reference, validate
from tandem.monitor.progress import Reporter
from tandem.monitor.recorder import Recorder, new_run_id
from tandem.monitor.sinks import Fanout, open_sinks
from tandem.monitor.store import store_location
from tandem.runtime import Runtime, start, stop
from tandem.task import Task
from tandem.trainer.guard import Preempted
from tandem.trainer.loop import Trainer, export_model
from tandem.trainer.rundir import prepare_run_dir

log = logging.getLogger("tandem")


@dataclass(frozen=True)
class RunResult:
    """What `fit` hands back: the trained module and the run's summary."""

    # The user's module with the trained weights, on this process's device; None under
    # plan.init "deferred" with fsdp (the model need not fit in one process: its weights
    # are in the run's checkpoints).
    model: nn.Module | None
    summary: dict[str, Any]
    run_dir: Path


def _setup_logging(runtime: Runtime) -> None:
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    prefix = "[tandem]" if runtime.is_main else f"[tandem rank {runtime.rank}]"
    handler.setFormatter(logging.Formatter(f"{prefix} %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO if runtime.is_main else logging.WARNING)
    log.propagate = False


def config_from_argv(argv: list[str], defaults: dict[str, Any] | None = None) -> Config:
    """Parse `--config FILE`, `--plan FILE` and `--section.field VALUE` flags; `--help` prints
    the options. A plan file may also come from the environment (TANDEM_PLAN, set by
    `tandem run --plan FILE`)."""
    args = parse_args(argv)
    if args.help:
        if os.environ.get("RANK", "0") == "0":  # once per job, not once per process
            sys.stdout.write(reference() + "\n")
        raise SystemExit(0)
    plan = args.plan or os.environ.get("TANDEM_PLAN") or None
    return load(args.config, args.overrides, defaults, plan)


def fit(task: Task, config: Config | None = None, argv: list[str] | None = None,
        defaults: dict[str, Any] | None = None) -> RunResult:
    """Train `task` on every process of the job; return the trained model and a summary.

    Must be called on all processes. Without `config`, the settings come from `argv`
    (default: the script's command line), applied over `defaults` ({"train.steps": 300,
    ...}: the script's own recipe). The run resumes from its latest good
    checkpoint when one exists (`run.resume`).
    """
    if config is not None:
        return _run(task, validate(config))
    try:
        config = config_from_argv(sys.argv[1:] if argv is None else argv, defaults)
    except ValueError as err:
        # A bad command line: one clear line instead of a traceback, and a usage exit code.
        if os.environ.get("RANK", "0") == "0":
            sys.stderr.write(f"tandem: error: {err}\n")
        raise SystemExit(2) from None
    return _run(task, config)


def _run(task: Task, config: Config) -> RunResult:
    name = config.run.name or Path(sys.argv[0]).stem or "run"
    runtime = start(config.plan)
    _setup_logging(runtime)
    try:
        result = _fit(task, config, runtime, name)
    except Preempted:
        stop(runtime)  # every rank agreed to stop here: a clean teardown
        raise
    except BaseException:
        # This rank failed, perhaps alone: the others may be inside a collective, and a
        # barrier would wait for them until the timeout. Leave at once; the launcher
        # stops the others when this process exits.
        stop(runtime, clean=False)
        raise
    stop(runtime)
    return result


def _fit(task: Task, config: Config, runtime: Runtime, name: str) -> RunResult:
    check_same_config(config, runtime)
    run_dir = prepare_run_dir(config, name, runtime)
    trainer = Trainer(task, config, runtime, run_dir)
    try:
        return _train(trainer, config, runtime, name)
    except (dist.DistError, RuntimeError) as err:
        if runtime.distributed:
            # Gloo reports a timed-out collective as a plain RuntimeError ("Application
            # timeout caused pair closure"): the liveness records name the rank that
            # stopped answering, and where it was. The error keeps its own type.
            err.add_note(f"ranks last seen: {trainer.describe_ranks()}")
        raise
    finally:
        trainer.close()


def _train(trainer: Trainer, config: Config, runtime: Runtime, name: str) -> RunResult:
    run_dir = trainer.run_dir
    found = trainer.resume()
    recorder: Recorder | Fanout | None = None
    if runtime.is_main:
        trainer.progress.run_id = trainer.progress.run_id or new_run_id(name)
        # Sinks first: a busy port must not leave a run recorded as running.
        sinks = open_sinks(tensorboard=config.monitor.tensorboard,
                           prometheus_port=config.monitor.prometheus_port,
                           prometheus_host=config.monitor.prometheus_host,
                           run_id=trainer.progress.run_id, run_dir=run_dir)
        recorder = Recorder(store_path(config), trainer.progress.run_id, name, config.to_dict(),
                            trainer.plan(), str(runtime.device), runtime.world_size)
        if sinks:
            recorder = Fanout(recorder, *sinks)
    reporter = Reporter(recorder, config.train.steps, trainer.state.step,
                        config.monitor.progress, active=runtime.is_main)
    summary: dict[str, Any] | None = None
    status = "failed"
    try:
        if runtime.restart_count:
            reporter.event(trainer.state.step, "restart",
                           f"the launcher restarted the process group "
                           f"(restart {runtime.restart_count})")
        if found is not None:
            reporter.event(trainer.state.step, "resume",
                           f"resumed from {found} at step {trainer.state.step}")
        if trainer.state.step >= config.train.steps:
            reporter.event(trainer.state.step, "complete",
                           f"run {name!r} is already complete at step {trainer.state.step}; "
                           "raise train.steps to continue or pick another run.name")
        summary = trainer.run(reporter)
        if runtime.is_main:
            summary.update(_scaling(config, trainer.progress.run_id, summary, runtime.world_size))
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        status = "completed"
        return RunResult(model=export_model(trainer), summary=summary, run_dir=run_dir)
    except Preempted:
        status = "preempted"
        raise
    finally:
        reporter.close(summary, status)


def _scaling(config: Config, run_id: str, summary: dict[str, Any],
             world_size: int) -> dict[str, Any]:
    """Scaling efficiency against a one-process run of the same work, when the store has one."""
    try:
        return scaling_figures(store_path(config), run_id, summary.get("samples_per_s", 0.0),
                               world_size)
    except Exception as err:  # an analysis must never fail the run it describes
        log.warning("scaling efficiency: %s", err)
        return {}


def check_same_config(config: Config, runtime: Runtime) -> None:
    """Refuse to train, on every rank, if the ranks were given different configs."""
    if not dist.is_initialized():
        return
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()
    mine = torch.tensor([int(digest[:15], 16)], dtype=torch.int64, device=runtime.device)
    everyone = [torch.zeros_like(mine) for _ in range(runtime.world_size)]
    dist.all_gather(everyone, mine)
    values = [int(t.item()) for t in everyone]
    if len(set(values)) > 1:
        groups: dict[int, list[int]] = {}
        for rank, value in enumerate(values):
            groups.setdefault(value, []).append(rank)
        shown = " vs ".join(f"ranks {ranks}" for ranks in groups.values())
        raise ValueError(f"the ranks were started with different configs ({shown}); every "
                         "rank must get the same config file and flags")


def store_path(config: Config) -> Path:
    """Where this run is recorded (see `store_location`)."""
    return store_location(config.monitor.store or None, config.run.dir)
