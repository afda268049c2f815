"""The step engine: build the run from a Task and a Config, train, evaluate, checkpoint."""

from __future__ import annotations

import copy
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from tandem import checkpoint
from tandem.checkpoint import CheckpointManager, ModelWeights, OptimizerState
from tandem.config import Config, parse_ramp, parse_target
from tandem.config_values import target_met
from tandem.data.loader import collate_of, to_device, train_batches
from tandem.data.memory import held, load_seconds
from tandem.data.sampler import GlobalBatchSampler, check_sizes, split_batch
from tandem.data.seqlen import SeqRamp
from tandem.faults import FaultPlan
from tandem.losses import training_task
from tandem.monitor.heartbeat import Heartbeat
from tandem.monitor.live import LiveMonitor
from tandem.monitor.progress import Reporter
from tandem.monitor.system import process_times
from tandem.optim.schedule import LrController
from tandem.parallel import build_strategy
from tandem.parallel.mesh import layout
from tandem.runtime import Runtime, derive_seed, seed_all, seed_step
from tandem.task import Task
from tandem.trainer import preflight, restore
from tandem.trainer.calibration import Calibration
from tandem.trainer.ema import WeightAverage, averaged
from tandem.trainer.evaluate import EvaluationError, evaluate
from tandem.trainer.guard import STATUS_FILE_ENV, Interrupted, Preempted, PreemptionFlag, agree
from tandem.trainer.precision import Precision
from tandem.trainer.resumed import Resumed, optimizer_record
from tandem.trainer.state import Progress, TrainState
from tandem.trainer.step import StepParts, StepRunner
from tandem.trainer.timing import RunClock, WindowClock

log = logging.getLogger("tandem")

class Trainer:
    """One training run of a Task under a Config on this process's Runtime."""

    def __init__(self, task: Task, config: Config, runtime: Runtime, run_dir: Path) -> None:
        """Build everything the run needs, checking the task's parts before any collective
        (`preflight`): a mistake stops every rank at once with one message. All ranks."""
        self.task, self.config, self.runtime, self.run_dir = task, config, runtime, run_dir
        # Ranks on a (data-parallel x tensor-parallel) mesh; without tensor parallelism
        # the data-parallel rank and size are the global ones.
        self.layout = layout(config.plan.tp, runtime.rank, runtime.world_size, runtime.device)
        self.strategy = build_strategy(config.plan, runtime, self.layout, config.run.seed)
        with preflight.stage():
            model = self._build_data_and_model()
        self.model = self.strategy.distribute(model, task.tensor_parallel)
        self.ema = (WeightAverage(self.strategy.module, config.train.ema_decay)
                    if config.train.ema_decay else None)
        with preflight.stage():
            self.optimizer = preflight.check_optimizer(task.optimizer(self.model.parameters()))
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            share = getattr(self.optimizer, "share_work", None)  # e.g. Muon
            if share is not None and self.strategy.identical_replicas and self.layout.dp_size > 1:
                share(self.layout.dp_group, self.strategy.shared_memory())
            self.lr = LrController(self.optimizer, config.optim, config.train.steps,
                                   config.train.global_batch,
                                   self.batch_at if self.ramp else None)
            self.precision = Precision(config.precision, runtime.device)
            self.target = parse_target(config.train.target) if config.train.target else None
            preflight.check_target(self.target, task.metrics, self.eval_dataset is not None)
            batch = preflight.first_batch(self.dataset, list(range(self.micro)), self.collate)
        batch = to_device(batch, runtime.device)
        with preflight.stage():
            preflight.check_step(task, self.strategy.module, batch, self.precision.autocast)
        self.state, self.progress = TrainState(), Progress()
        self.last_eval: dict[str, float] = {}
        self.eval_s = 0.0  # evaluation time of this attempt
        self.started_at: float | None = None  # when this attempt's training began
        self.stopped_at_target = False  # train.stop_at_target ended the run early
        self.faults = FaultPlan.from_env(runtime.rank, runtime.restart_count)
        self.preemption = PreemptionFlag(announce=runtime.is_main)
        self.heartbeat = Heartbeat(runtime.store, runtime.rank, runtime.world_size,
                                   config.fault.heartbeat_s)
        self.monitor = LiveMonitor(
            device=runtime.device, rank=runtime.rank, world_size=runtime.world_size,
            log_every=config.monitor.log_every, tokens_per_sample=task.tokens_per_sample,
            timing=config.monitor.timing, sharded=self.strategy.shards_weights,
            measures_comm=self.strategy.times_comm)
        self.steps = StepRunner(StepParts(
            task=self.train_task, config=config, model=self.model, optimizer=self.optimizer,
            params=self.params, strategy=self.strategy, precision=self.precision,
            monitor=self.monitor, layout=self.layout, state=self.state, micro=self.micro,
            device=runtime.device, heartbeat=self.heartbeat, faults=self.faults))
        self.calibration = Calibration(self.steps.p)
        self.checkpoints = CheckpointManager(
            run_dir / "checkpoints",
            {"model": ModelWeights(self.model),
             "optim": OptimizerState(self.model, self.optimizer),
             "strategy": self.strategy, "precision": self.precision,
             "train": self.state, "progress": self.progress,
             **({"ema": self.ema} if self.ema is not None else {})},
            keep=config.checkpoint.keep, asynchronous=config.checkpoint.async_save,
            device=runtime.device, timeout_s=config.plan.timeout_s, hook=self._checkpoint_hook)

    def _build_data_and_model(self) -> torch.nn.Module:
        """Batch split, datasets and the model factory: local checks only."""
        task, train = self.task, self.config.train
        self.micro, self.accum = split_batch(train.global_batch, train.micro_batch,
                                             self.layout.dp_size)
        self.ramp = parse_ramp(train.batch_ramp, train.global_batch) if train.batch_ramp else []
        if self.config.plan.static_graph and (self.accum > 1 or self.ramp):
            raise ValueError(
                f"plan.static_graph: true with {self.accum} accumulation passes a step (or "
                "a batch ramp) fails inside DDP's reducer, which expects every parameter "
                "once per step; keep one: static_graph false, or train.micro_batch 0")
        for _, size in self.ramp:
            if size % (self.micro * self.layout.dp_size):
                raise ValueError(
                    f"train.batch_ramp: batch {size} is not a multiple of micro-batch "
                    f"{self.micro} x {self.layout.dp_size} data-parallel processes; the ramp "
                    "grows the batch by accumulation, so each batch must be one")
        # Same value on every rank and at every world size: the same data and the same
        # initial weights as a one-process run.
        seed_all(derive_seed("build", self.config.run.seed))
        self.train_task = training_task(task, train.label_smoothing)
        self.dataset = task.train_data()
        preflight.check_dataset(self.dataset, "train_data")
        self.collate = collate_of(self.dataset, task.collate)
        self.dataset = held(self.dataset, self.config.data, "train_data", self.collate)
        for size in {train.global_batch, *(size for _, size in self.ramp)}:
            check_sizes(len(self.dataset), size, self.micro * self.layout.dp_size)  # type: ignore[arg-type]
        self.eval_dataset = task.eval_data() if task.eval_data is not None else None
        if self.eval_dataset is not None:
            preflight.check_dataset(self.eval_dataset, "eval_data")
            self.eval_dataset = held(self.eval_dataset, self.config.data, "eval_data",
                                     collate_of(self.eval_dataset, task.collate))
        return self.strategy.build(task.model)

    def batch_at(self, step: int) -> int:
        """The global batch of optimizer step `step` (train.batch_ramp, else global_batch)."""
        size = self.config.train.global_batch
        for start, ramp_size in self.ramp:
            if step >= start:
                size = ramp_size
        return size

    def plan(self) -> dict[str, Any]:
        """The execution plan in force: how the work is spread and computed."""
        cfg = self.config
        return {
            **self.strategy.describe(),
            "world_size": self.runtime.world_size,
            "data_parallel": self.layout.dp_size,
            "tensor_parallel": self.layout.tp_size,
            "micro_batch": self.micro,
            "accumulation": self.accum,
            "batch_ramp": cfg.train.batch_ramp,
            "activation_checkpointing": cfg.plan.activation_checkpointing,
            "compile": cfg.plan.compile,
            "init": cfg.plan.init,
            "precision": cfg.precision.mode,
            "attention": self.precision.attention,  # 'auto' resolved for this device
            "data_workers": cfg.data.workers,
            "device": str(self.runtime.device),
        }

    # ------------------------------------------------------------ checkpoints
    def resume(self) -> Resumed:
        """Load the latest good checkpoint as `run.resume` says (`restore.resume`). All ranks."""
        return restore.resume(self)

    def save(self, reporter: Reporter, clock: RunClock) -> None:
        """Start a checkpoint of the current state; record how long the step waited."""
        self.progress.elapsed_s = clock.elapsed()
        self.checkpoints.lineage = self.progress.run_id
        blocked = self.checkpoints.save(self.state.step, {
            "config": self.config.to_dict(), "world_size": self.runtime.world_size,
            "optimizer": optimizer_record(self.optimizer)})
        reporter.record(self.state.step, {"time/checkpoint_blocking_s": blocked})

    def _checkpoint_hook(self, moment: str, step: int, path: Path) -> None:
        """Injected faults: 'checkpoint_write' before a commit, 'checkpoint' after one."""
        if self.faults is not None:
            self.faults.hit("checkpoint_write" if moment == "written" else "checkpoint",
                            step, path)

    def _stop(self, reporter: Reporter, clock: RunClock, interrupt: bool) -> None:
        """Commit a checkpoint at this step boundary and stop with a resumable status."""
        if self.checkpoints.last_step != self.state.step:
            self.save(reporter, clock)
        path = self.checkpoints.wait() or self.checkpoints.root / f"step_{self.state.step:09d}"
        kind = "interrupted" if interrupt else "preempted"
        from tandem.sched.attempt import scheduler_stop  # a cancel is not a preemption

        words, then = (None if interrupt else scheduler_stop()) or (
            kind, "run the same command again to continue")
        reporter.event(self.state.step, kind,
                       f"{words}: checkpoint {path} committed at step {self.state.step}; {then}")
        status_file = os.environ.get(STATUS_FILE_ENV)
        if status_file and self.runtime.is_main:  # how `tandem run` learns why it stopped
            Path(status_file).write_text(f"{kind} {self.state.step}\n")
        raise (Interrupted if interrupt else Preempted)(self.state.step, str(path))

    # ------------------------------------------------------------ evaluation
    def _evaluate(self) -> dict[str, float]:
        if self.eval_dataset is None:
            return {}
        with averaged(self.ema, self.strategy.weights_replaced):
            values = evaluate(self.task, self.strategy.module, self.eval_dataset,
                              self.runtime, self.config.train.eval_batch, self.config.data,
                              self.precision, self.layout, views=self.config.train.eval_views)
        return {f"eval_{k}" if k == "loss" else k: v for k, v in values.items()}

    def _check_target(self, values: dict[str, float], elapsed: float, done: float) -> bool:
        if self.target is None or self.progress.target_reached is not None:
            return False
        value = target_met(self.target, values)
        if value is None:
            return False
        # elapsed_s: when the evaluation that met it began; evaluated_s: when it ended.
        self.progress.target_reached = {"step": self.state.step, "elapsed_s": elapsed,
                                        "value": value, "evaluated_s": done}
        return True

    def _run_evaluation(self, reporter: Reporter, clock: RunClock) -> bool:
        """Evaluate now; record it; return whether the target was reached by it."""
        cfg, step = self.config, self.state.step
        self.heartbeat.at(step, "eval")
        self.steps.fault("eval")
        elapsed = clock.elapsed()
        self.last_eval = self._evaluate()
        done = clock.elapsed()
        self.eval_s += done - elapsed
        if self.last_eval:
            reporter.evaluation(step, self.last_eval)
        if self._check_target(self.last_eval, elapsed, done):
            reporter.event(step, "target", f"target {cfg.train.target} reached at step "
                                           f"{step} after {elapsed:.1f} s")
            return True
        return False

    def _guarded_evaluation(self, reporter: Reporter, clock: RunClock) -> bool:
        """An evaluation whose failure loses no training: one every rank agreed on commits
        this step first (`EvaluationError.committed`); the last evaluation follows the
        run's last checkpoint already."""
        try:
            return self._run_evaluation(reporter, clock)
        except EvaluationError as err:
            raise err.committed(self.state.step, self._commit(reporter, clock)) from err
        except Exception as err:
            try:
                saved = self.checkpoints.wait()
            except checkpoint.CheckpointError:
                saved = None
            if saved is not None or self.checkpoints.last_step == self.state.step:
                err.add_note(f"training reached step {self.state.step} and its checkpoint is "
                             f"committed ({self.checkpoints.root}); fix the evaluation and run "
                             "the same command again: it evaluates without training again")
            raise

    def _commit(self, reporter: Reporter, clock: RunClock) -> str | None:
        """Commit the state at this step (every rank); its path, or None if that failed."""
        try:
            if self.checkpoints.last_step != self.state.step:
                self.save(reporter, clock)
            saved = self.checkpoints.wait()
        except checkpoint.CheckpointError as err:
            log.error("%s", err)
            return None
        return str(saved or self.checkpoints.root / f"step_{self.state.step:09d}")

    # -------------------------------------------------------------------- run
    def run(self, reporter: Reporter) -> dict[str, Any]:
        """Train to `train.steps`, evaluating and checkpointing on schedule. All ranks."""
        cfg, rt, progress = self.config, self.runtime, self.progress
        sampler = GlobalBatchSampler(
            dataset_len=len(self.dataset),  # type: ignore[arg-type]
            global_batch=cfg.train.global_batch, accum=self.accum, rank=self.layout.dp_rank,
            world_size=self.layout.dp_size, seed=cfg.run.seed, cursor=progress.cursor,
            batch_at=self.batch_at if self.ramp else None, step=self.state.step,
        )
        batches = train_batches(self.dataset, sampler, cfg.data, rt.device, self.collate)
        if cfg.train.seq_ramp:
            batches = SeqRamp(cfg.train.seq_ramp).apply(batches, lambda: self.state.step)
        clock, window = RunClock(progress.elapsed_s), WindowClock()
        self.started_at = time.time()
        self.model.train()
        # Calibration counts from this segment's first step: a resumed or resized run
        # measures again (its size, its link and its step may be another run's).
        first = self.state.step
        while self.state.step < cfg.train.steps and not self.stopped_at_target:
            self._one_step(batches, window, reporter, sampler.dataset_len, clock)
            window.pause()  # logging, evaluation and checkpoints are not training time
            if self.state.step - first == cfg.monitor.calibrate_at:
                self.calibration.run(self.steps.last_batch, self.accum, reporter)
            if self.state.step % cfg.monitor.log_every == 0 or self.state.step == cfg.train.steps:
                self._log_window(window, reporter, clock)
            else:
                reporter.advance(self.state.step)
            # After a rollback the step went back: whether this is the last is asked anew.
            self._on_schedule(self.state.step == cfg.train.steps, reporter, clock)
            window.resume()
        if not self.last_eval:
            self._guarded_evaluation(reporter, clock)
        self.checkpoints.wait()
        progress.elapsed_s = clock.elapsed()
        return self.summary()

    def _one_step(self, batches: Any, window: WindowClock, reporter: Reporter,
                  dataset_len: int, clock: RunClock) -> None:
        cfg, state = self.config, self.state
        self.heartbeat.at(state.step, "step")
        self.steps.fault("step")
        # Tensor-parallel peers draw the same numbers (they compute one replica together).
        seed_step(cfg.run.seed, self.layout.dp_rank, state.step)
        window.lr = self.lr.apply(state.step)
        size = self.batch_at(state.step)
        started = time.perf_counter()
        loss, norm, skipped, passes = self.steps.run(batches, size)
        window.steps += 1
        window.passes += passes
        state.step += 1
        # Step time includes a low-communication meeting, as the window's time/step does.
        self.monitor.clock.begin("comm", on_device=True)
        self.strategy.after_step(state.step, last=state.step == cfg.train.steps)
        self.monitor.clock.end()
        if self.ema is not None and not skipped:
            self.ema.update()
        self.monitor.step(loss, norm, time.perf_counter() - started, size)
        self.progress.cursor.take(size, dataset_len)
        self.progress.samples += size
        if skipped:
            reason = f"non-finite gradient norm ({norm.item()}) at step {state.step - 1}"
            if cfg.fault.nonfinite == "raise":
                raise FloatingPointError(reason + " (fault.nonfinite = 'raise')")
            if cfg.fault.nonfinite == "rollback":
                restore.rollback(self, state.step - 1, reason, reporter)
            else:
                reporter.event(state.step - 1, "skip", f"{reason}: the update was skipped")

    def _log_window(self, window: WindowClock, reporter: Reporter, clock: RunClock) -> None:
        self.progress.train_s += window.busy
        self.heartbeat.at(self.state.step, "window")
        extra = {"lr": window.lr, "loss_scale": self.precision.loss_scale,
                 **self.strategy.window_figures(window.steps, window.passes)}
        closed = self.monitor.close(self.state.step, window.busy, extra)
        window.clear()
        spike, drifted = 0, False
        if closed is not None:
            reporter.window(closed)
            spikes = [e.step for e in closed.events if e.kind == "loss_spike"]
            if spikes and self.config.fault.spike == "rollback":
                spike = min(spikes)
            drifted = self.calibration.drifted(closed.step_s)
        decision = agree(self.preemption.requested, spike, self.runtime.device, drifted)
        if decision.recalibrate:
            self.calibration.relink(reporter)
        if decision.stop:
            self._stop(reporter, clock, decision.stop == PreemptionFlag.INTERRUPT)
        if decision.rollback_before:
            restore.rollback(self, decision.rollback_before,
                             f"loss spike at step {decision.rollback_before}", reporter)

    def _on_schedule(self, last: bool, reporter: Reporter, clock: RunClock) -> None:
        """Checkpoint and evaluate when the config says so.

        The run's last checkpoint is taken before its last evaluation (which then
        overlaps the background write): an evaluation that fails cannot lose training.
        """
        cfg, step = self.config, self.state.step
        evaluate_now = last or (cfg.train.eval_every and step % cfg.train.eval_every == 0
                                and step >= cfg.train.eval_from)
        every = cfg.checkpoint.every
        save_now = (every and step % every == 0) or (last and cfg.checkpoint.at_end)
        if save_now and last:
            self.heartbeat.at(step, "checkpoint")
            self.save(reporter, clock)
        if evaluate_now:
            reached = self._guarded_evaluation(reporter, clock)
            if reached and save_now and last:
                self.save(reporter, clock)  # the checkpoint must know the target is met
            if reached and cfg.train.stop_at_target and not last:
                self.stopped_at_target = True  # every rank saw the same reduced values
                if cfg.checkpoint.at_end:
                    self.save(reporter, clock)
                return
        if save_now and not last:
            self.heartbeat.at(step, "checkpoint")
            self.save(reporter, clock)

    def close(self) -> None:
        """Finish a checkpoint in flight, stop the liveness thread, give SIGTERM back."""
        try:
            self.checkpoints.close()
        except checkpoint.CheckpointError as err:
            log.error("%s", err)
        finally:
            self.heartbeat.close()
            self.preemption.close()

    def describe_ranks(self) -> str:
        """Where every rank was last seen (for hang reports)."""
        return self.heartbeat.describe()

    def summary(self) -> dict[str, Any]:
        """The run's outcome as JSON-ready values."""
        progress, cfg = self.progress, self.config
        summary: dict[str, Any] = {
            "name": self.run_dir.name,
            "steps": self.state.step,
            "world_size": self.runtime.world_size,
            "global_batch": cfg.train.global_batch,
            "micro_batch": self.micro,
            "accumulation": self.accum,
            "wall_time_s": progress.elapsed_s,
            **process_times(self.started_at),
            "eval_time_s": self.eval_s,
            "calibration_s": self.calibration.seconds,
            "samples_per_s": progress.samples / progress.train_s if progress.train_s else 0.0,
            **self.monitor.percentiles(),
            **self.last_eval,
        }
        if cfg.data.in_memory:  # part of startup_s: what reading the data up front cost
            summary["data_load_s"] = load_seconds(self.dataset, self.eval_dataset)
        if self.task.tokens_per_sample:
            summary["tokens_per_s"] = summary["samples_per_s"] * self.task.tokens_per_sample
        if self.started_at is not None:  # this attempt's first step (time.time())
            summary["train_started_at"] = self.started_at
        if progress.target_reached is not None:
            summary["time_to_target_s"] = progress.target_reached["elapsed_s"]
            if "evaluated_s" in progress.target_reached:
                summary["time_to_target_end_s"] = progress.target_reached["evaluated_s"]
            summary["target"] = f"{cfg.train.target} at step {progress.target_reached['step']}"
        elif self.target is not None:
            summary["target"] = f"{cfg.train.target} not reached"
        summary["run_dir"] = str(self.run_dir)
        return summary


def export_model(trainer: Trainer) -> torch.nn.Module | None:
    """The trained weights (their average under train.ema_decay) in a plain module that no
    process group owns. All ranks."""
    with averaged(trainer.ema, trainer.strategy.weights_replaced):
        model = trainer.strategy.export_model(trainer.task.model)
        if trainer.ema is not None and model is trainer.strategy.module:
            model = copy.deepcopy(model)  # the live module gets its own weights back
    return model
