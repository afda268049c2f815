"""`tandem.fit`: the one call a training script makes."""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from tandem.components import Component
from tandem.components.liveness import last_seen
from tandem.config import USAGE, Config, load, parse_args, plan_overrides, reference, validate
from tandem.errors import PreflightError, UsageError
from tandem.monitor.recorder import new_run_id
from tandem.monitor.sinks import check_sink_packages
from tandem.monitor.startup import STARTUP
from tandem.runtime import Runtime, start, stop
from tandem.status import ExitStatus, RunStatus
from tandem.task import Task
from tandem.trainer.evaluate import EvaluationError
from tandem.trainer.guard import STATUS_FILE_ENV, Interrupted, Preempted, StartupInterrupt
from tandem.trainer.loop import Trainer
from tandem.trainer.record import RunRecord
from tandem.trainer.rundir import Lease, run_dir_of, take_lease

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
    the usage and every option with the value this script runs with. A plan file may also
    come from the environment (TANDEM_PLAN, set by `tandem run --plan FILE`)."""
    args = parse_args(argv)
    if args.help:
        if os.environ.get("RANK", "0") == "0":  # once per job, not once per process
            sys.stdout.write(USAGE + "\n" + reference(defaults) + "\n")
        raise SystemExit(0)
    plan = args.plan or os.environ.get("TANDEM_PLAN") or None
    config = load(args.config, args.overrides, defaults, plan)
    if plan is not None and os.environ.get("RANK", "0") == "0":  # once per job
        for key, planned, flag in plan_overrides(plan, args.overrides):
            sys.stderr.write(f"tandem: warning: --{key} {flag!r} overrides the plan file's "
                             f"{key} = {planned!r} ({plan}); flags win over the plan\n")
    return config


def fit(task: Task, config: Config | None = None, argv: list[str] | None = None,
        defaults: dict[str, Any] | None = None,
        components: Sequence[Component] = ()) -> RunResult:
    """Train `task` on every process of the job; return the trained model and a summary.

    Must be called on all processes. Without `config`, the settings come from `argv`
    (default: the script's command line), applied over `defaults` ({"train.steps": 300,
    ...}: the script's own recipe). The run resumes from its latest good
    checkpoint when one exists (`run.resume`). A mistake in the task or the settings
    stops every process before anything is written for the run: with a `config`, as a
    UsageError (a ValueError) on every process; from the command line, as one message
    printed once and exit status 2. Ctrl-C stops at the next step boundary with a
    checkpoint (exit status 130), SIGTERM likewise (75). `components` are added to the
    run after the task's own (`Task.components`), each a `tandem.Component`.
    """
    STARTUP.begin()
    script = config is None
    startup = StartupInterrupt()
    try:
        return _start_and_fit(task, config, argv, defaults, script, startup, components)
    except BaseException:
        if not (startup.received and script):
            raise
        # A Ctrl-C during start-up, or what it caused (a peer that left a collective).
        startup.exit(os.environ.get("RANK", "0") == "0")
        raise
    finally:
        startup.close()


def _settled(config: Config | None, argv: list[str] | None,
             defaults: dict[str, Any] | None) -> Config:
    """The run's settings, checked, with the packages its sinks need: `config` as given,
    else from the command line (`config_from_argv`), where a mistake is one line, said
    once, and exit status 2."""
    script = config is None
    try:
        if config is None:
            config = config_from_argv(sys.argv[1:] if argv is None else argv, defaults)
        else:
            config = validate(config)
        check_sink_packages(config.monitor.tensorboard, config.monitor.prometheus_port)
    except ValueError as err:
        if not script:
            raise
        _usage_exit(str(err), os.environ.get("RANK", "0") == "0")
    return config


def _usage_exit(message: str, speak: bool) -> None:
    """One line, said once, and exit status 2.

    Under `tandem run` every rank hands the line to the launcher, which prints it: its
    agent stops the other workers as soon as one has exited, which may be before the
    rank meant to speak has spoken. Otherwise the rank that `speak`s prints it."""
    status_file = os.environ.get(STATUS_FILE_ENV)
    if status_file:
        # Every rank writes the same line; a rename, so the launcher never reads half.
        part = Path(f"{status_file}.{os.getpid()}")
        part.write_text(f"usage 0\n{message}\n")
        part.replace(status_file)
    elif speak:
        sys.stderr.write(f"tandem: error: {message}\n")
    raise SystemExit(ExitStatus.USAGE)


def _start_and_fit(task: Task, config: Config | None, argv: list[str] | None,
                   defaults: dict[str, Any] | None, script: bool, startup: StartupInterrupt,
                   components: Sequence[Component]) -> RunResult:
    config = _settled(config, argv, defaults)
    name = config.run.name or Path(sys.argv[0]).stem or "run"
    try:
        with STARTUP.part("runtime"):
            runtime = start(config.plan)
    except ValueError as err:  # the device or backend asked for is not here: on every rank
        if not script:
            raise UsageError(str(err)) from err
        _usage_exit(str(err), os.environ.get("RANK", "0") == "0")
    _setup_logging(runtime)
    try:
        result = _fit(task, config, runtime, name, startup, components)
    except (Preempted, UsageError) as err:
        stop(runtime)  # every rank stopped here together: a clean teardown
        if isinstance(err, UsageError):
            _report_usage(err, runtime, script)
        raise
    except EvaluationError:
        stop(runtime)  # agreed by every rank, its training committed; rank 0 said why
        if script:
            raise SystemExit(ExitStatus.USAGE) from None
        raise
    except BaseException:
        # This rank failed, perhaps alone: the others may be inside a collective, and a
        # barrier would wait for them until the timeout. Leave at once; the launcher
        # stops the others when this process exits.
        stop(runtime, clean=False)
        raise
    finally:
        if not script:
            gc.unfreeze()  # see _frozen_for_the_run
    stop(runtime)
    return result


# _frozen_for_the_run: when training starts, every object alive (torch's import alone
# leaves hundreds of thousands, the model, data held in memory) is moved out of the
# cyclic garbage collector's reach (`gc.freeze`). A full collection over them pauses one
# rank while the others wait for it, and the interpreter's exit runs several, which a
# preemption or a resize waits for. A script's run ends its
# process, and stays frozen; `fit` called with a config (a notebook, a test: the process
# goes on) unfreezes when it returns or raises, so that what the run left behind can be
# collected again.


def _report_usage(err: UsageError, runtime: Runtime, script: bool) -> None:
    """From a script, say it once (the rank that saw it) and exit with status 2. Nothing
    goes into the run store: a run that never trained is no run (a repeated mistake
    would fill `tandem runs` with failed rows)."""
    ranks = err.ranks if isinstance(err, PreflightError) else [0]
    if not script:
        return
    launched = bool(os.environ.get(STATUS_FILE_ENV))  # `tandem run` prints the line
    if ranks[0] != 0 and runtime.rank == 0 and not launched:
        sys.stderr.write(f"tandem: error: rank {ranks[0]} failed its checks (its message "
                         "is above)\n")
    where = (f" (ranks {ranks})" if len(ranks) > 1 else
             f" (rank {ranks[0]} failed its checks)" if launched and ranks[0] != 0 else "")
    _usage_exit(str(err) + where, runtime.rank == ranks[0])


def _fit(task: Task, config: Config, runtime: Runtime, name: str,
         startup: StartupInterrupt, components: Sequence[Component]) -> RunResult:
    check_same_config(config, runtime)
    run_dir = run_dir_of(config, name)
    with STARTUP.part("build"):
        trainer = Trainer(task, config, runtime, run_dir, components)
    startup.close()  # the trainer's PreemptionFlag has taken Ctrl-C over
    lease = take_lease(run_dir, runtime)
    try:
        record = RunRecord(config.monitor, config.run.dir, run_dir, name, runtime.is_main)
        return _train(trainer, config, runtime, record, lease)
    except (dist.DistError, RuntimeError) as err:
        if runtime.distributed:
            # Gloo reports a timed-out collective as a plain RuntimeError ("Application
            # timeout caused pair closure"): the liveness records name the rank that
            # stopped answering, and where it was. The error keeps its own type.
            err.add_note(f"ranks last seen: {last_seen(trainer.components.components)}")
        raise
    finally:
        trainer.close()
        lease.release()


def _train(trainer: Trainer, config: Config, runtime: Runtime, record: RunRecord,
           lease: Lease) -> RunResult:
    with STARTUP.part("resume"):
        resumed = trainer.resume()
    if resumed.complete and (done := record.finished(trainer.state.step)) is not None:
        return RunResult(model=trainer.export(), summary=done, run_dir=trainer.run_dir)
    lease.claim()
    fresh = not trainer.progress.run_id  # a resume keeps its record whatever happens
    run_id = trainer.run_id(new_run_id(record.name)) if runtime.is_main else ""
    plan = trainer.plan()
    reporter = record.open(config, run_id, plan, runtime.device, runtime.world_size,
                           trainer.state.step)
    summary: dict[str, Any] | None = None
    status, refused = RunStatus.FAILED, False
    try:
        resumed.report(reporter, runtime.restart_count)
        reporter.event(trainer.state.step, "segment",
                       f"{runtime.world_size} x {runtime.device}, {plan['strategy']}, micro-batch "
                       f"{plan['micro_batch']} x {plan['accumulation']}, {plan['precision']}",
                       value=float(runtime.world_size))
        gc.freeze()  # see _frozen_for_the_run
        summary = trainer.run(reporter)
        if trainer.started_at is not None:
            summary["startup_parts_s"] = STARTUP.figures(trainer.started_at)
        if trainer.calibration.parts:
            summary["calibration_parts_s"] = dict(trainer.calibration.parts)
        status = RunStatus.COMPLETED
        return RunResult(model=trainer.export(), summary=summary, run_dir=trainer.run_dir)
    except Interrupted:
        status = RunStatus.INTERRUPTED
        raise
    except Preempted:
        status = _stopped_status()
        raise
    except BaseException as err:
        refused = isinstance(err, UsageError)
        reporter.event(trainer.state.step, "crash", f"{type(err).__name__}: {err}"[:2000])
        raise
    finally:
        record.close(reporter, summary, status, trainer.state.step, runtime.world_size,
                     forget=refused and fresh and trainer.state.step == 0)


def _stopped_status() -> RunStatus:
    """A graceful stop's run status: cancelled when it was the scheduler's cancel (the
    run ends there, though its checkpoint is committed), else preempted."""
    from tandem.sched.service.attempt import stop_reason  # only a scheduled run has a reason

    return RunStatus.CANCELLED if stop_reason() == "cancel" else RunStatus.PREEMPTED


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
        raise UsageError(f"the ranks were started with different configs ({shown}); every "
                         "rank must get the same config file and flags")
