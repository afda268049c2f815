"""The step engine: a thin sequencer over the strategy (how the model is spread and a
step's passes run), the run's components (in order) and the trainer's own state, whose
one list gives the checkpoint's states and a rollback's set."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint import CheckpointError, CheckpointManager
from tandem.components import Chain, Component, RunParts
from tandem.components.base import checkpoint_states, rollback_names
from tandem.config import Config, parse_target
from tandem.data.loader import to_device
from tandem.data.memory import load_seconds
from tandem.monitor.catalogue import LOSS_SCALE, LR, TIME_CHECKPOINT_BLOCKING
from tandem.monitor.live import LiveMonitor
from tandem.optim import share_work
from tandem.optim.schedule import LrController
from tandem.parallel import build_strategy, plan_layout
from tandem.runtime import Runtime
from tandem.task import Task
from tandem.trainer import preflight, restore
from tandem.trainer.builtin import builtin
from tandem.trainer.calibration import Calibration
from tandem.trainer.data import build_data
from tandem.trainer.evaluations import Evaluations
from tandem.trainer.export import exported
from tandem.trainer.guard import PreemptionFlag, agree, stop_committed
from tandem.trainer.pace import pace_of
from tandem.trainer.precision import Precision
from tandem.trainer.progress import Reporter
from tandem.trainer.resumed import Resumed, optimizer_record
from tandem.trainer.state import Progress, TrainState, own_states
from tandem.trainer.step import StepParts, StepRunner
from tandem.trainer.summary import plan_of, summary_of
from tandem.trainer.timing import RunClock, WindowClock

log = logging.getLogger("tandem")


class Trainer:
    """One training run of a Task under a Config on this process's Runtime."""

    def __init__(self, task: Task, config: Config, runtime: Runtime, run_dir: Path,
                 components: Sequence[Component] = ()) -> None:
        """Build everything the run needs, checking the task's parts before any collective
        (`preflight`): a mistake stops every rank at once with one message. All ranks."""
        self.task, self.config, self.runtime, self.run_dir = task, config, runtime, run_dir
        with preflight.stage():
            own = list(task.components()) if task.components is not None else []
            self.components = Chain([*builtin(config, runtime, task), *own, *components])
        try:
            self.layout = plan_layout(config.plan, runtime)
            self.strategy = build_strategy(config.plan, runtime, self.layout, config.run.seed)
            self._build()
        except BaseException:
            self.components.close()
            raise

    def _build(self) -> None:
        task, config, runtime = self.task, self.config, self.runtime
        with preflight.stage():
            self.data = data = build_data(task, config, self.layout.dp_size)
            self.batches = data.batches
            model = self.components.transform_model(self.strategy.build(task.model),
                                                    runtime.device)
        self.model = self.strategy.distribute(model, task.tensor_parallel)
        with preflight.stage():
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.optimizer = preflight.check_optimizer(task.optimizer(self.params))
            share_work(self.optimizer, self.strategy, self.layout)
            self.lr = LrController(self.optimizer, config.optim, config.train.steps,
                                   config.train.global_batch,
                                   self.batches.size_at if self.batches.ramp else None)
            self.precision = Precision(config.precision, runtime.device)
            target = parse_target(config.train.target) if config.train.target else None
            preflight.check_target(target, task.metrics, data.eval_dataset)
            batch = preflight.first_batch(
                data.dataset, data.first_ids(self.batches.micro, config.run.seed), data.collate)
        self.monitor = LiveMonitor(
            device=runtime.device, rank=runtime.rank, world_size=runtime.world_size,
            log_every=config.monitor.log_every, tokens_per_sample=task.tokens_per_sample,
            timing=config.monitor.timing, sharded=self.strategy.shards_weights,
            measures_comm=self.strategy.times_comm,
            free_running=self.strategy.info.free_running)
        # Before any forward: FSDP2 leaves its unsharded parameters registered after one.
        self.components.setup(RunParts(self.model, self.strategy.module, self.optimizer,
                                       runtime.device, self.strategy.weights_replaced))
        batch = to_device(batch, runtime.device)
        with preflight.stage():
            preflight.check_step(task, self.strategy.module, batch, self.precision.autocast)
        self.state, self.progress = TrainState(), Progress()
        self.started_at: float | None = None  # when this attempt's training began
        self.stopped_at_target = False  # train.stop_at_target ended the run early
        self.preemption = PreemptionFlag(announce=runtime.is_main)
        self.steps = StepRunner(StepParts(
            task=data.train_task, config=config, model=self.model, optimizer=self.optimizer,
            params=self.params, strategy=self.strategy, precision=self.precision,
            monitor=self.monitor, batches=self.batches, device=runtime.device,
            components=self.components))
        self.calibration = Calibration(self.steps.p)
        self.pace = pace_of(self)
        self.evaluations = Evaluations(task, data.eval_dataset, config, runtime, self.strategy,
                                       self.precision, self.layout, self.components, target)
        # The trainer's own state, then the components': what a checkpoint holds, and
        # (those that say where the weights are) what a rollback restores.
        parts = [*own_states(self.model, self.optimizer, self.strategy, self.precision,
                             self.state, self.progress, self.components.restores_frozen),
                 *self.components.components]
        self.rollback_states = rollback_names(parts)
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", checkpoint_states(parts), keep=config.checkpoint.keep,
            asynchronous=config.checkpoint.async_save, device=runtime.device,
            timeout_s=config.plan.timeout_s, hook=self.components.after_checkpoint)

    def plan(self) -> dict[str, Any]:
        """The execution plan in force: how the work is spread and computed."""
        return plan_of(self.config, self.strategy, self.layout, self.batches, self.precision,
                       self.runtime.world_size, self.runtime.device)

    def run_id(self, fresh: str) -> str:
        """The run's id in the run store: the one it resumed with, else `fresh` (kept)."""
        self.progress.run_id = self.progress.run_id or fresh
        return self.progress.run_id

    def resume(self) -> Resumed:
        """Load the latest good checkpoint as `run.resume` says (`restore.resume`). All ranks."""
        train = self.config.train
        loaded = restore.resume(
            self.checkpoints, self.config, self.run_dir, optimizer_record(self.optimizer),
            self.components.optional, lambda: self.state.step >= train.steps or (
                train.stop_at_target and self.progress.target_reached is not None))
        for name in loaded.fresh:  # e.g. averaging switched on at this resume
            self.checkpoints.states[name].fresh_start()
        if loaded.resumed.path is not None:
            self.progress.attempts += 1
            self.lr.extra = self.progress.lr_scale
        return loaded.resumed

    def _rollback(self, bad_step: int, reason: str, reporter: Reporter) -> None:
        restore.rollback(self.checkpoints, self.rollback_states, self.progress,
                         self.config.fault, self.state.step, bad_step, reason, reporter)
        self.lr.extra = self.progress.lr_scale

    def save(self, reporter: Reporter, clock: RunClock) -> None:
        """Start a checkpoint of the current state; record how long the step waited."""
        self.components.at("checkpoint", self.state.step)
        self.progress.elapsed_s = clock.elapsed()
        self.checkpoints.lineage = self.progress.run_id
        blocked = self.checkpoints.save(self.state.step, {
            "config": self.config.to_dict(), "world_size": self.runtime.world_size,
            "optimizer": optimizer_record(self.optimizer)})
        reporter.record(self.state.step, {TIME_CHECKPOINT_BLOCKING: blocked})

    def _stop(self, reporter: Reporter, clock: RunClock, interrupt: bool) -> None:
        """Commit a checkpoint at this step boundary and stop with a resumable status."""
        if self.checkpoints.last_step != self.state.step:
            self.save(reporter, clock)
        path = self.checkpoints.wait() or self.checkpoints.root / f"step_{self.state.step:09d}"
        stop_committed(self.state.step, str(path), interrupt, self.runtime.is_main, reporter)

    def run(self, reporter: Reporter) -> dict[str, Any]:
        """Train to `train.steps`, evaluating and checkpointing on schedule. All ranks."""
        cfg, progress = self.config, self.progress
        self.pace.start()
        clock, window = RunClock(progress.elapsed_s), WindowClock()
        self.started_at = time.time()
        self.model.train()
        # Calibration counts from this segment's first step: a resumed or resized run
        # measures again (its size, its link and its step may be another run's).
        first = self.state.step
        while self.state.step < cfg.train.steps and not self.stopped_at_target:
            bad = self.pace.stretch(window, reporter)
            window.pause()  # logging, evaluation and checkpoints are not training time
            if bad is not None:
                # The window ends with the bad step: its steps are logged before they are
                # undone, and the steps run again start a window of their own.
                self._log_window(window, reporter, clock)
                self._rollback(self.state.step - 1, bad, reporter)
            if self.state.step - first == cfg.monitor.calibrate_at:
                self.calibration.run(self.steps.last_batch, self.batches.accum,
                                     self.state.step, reporter)
            step = self.state.step
            if bad is None and (step % cfg.monitor.log_every == 0 or step == cfg.train.steps):
                self._log_window(window, reporter, clock)
            else:
                reporter.advance(self.state.step)
            # After a rollback the step went back: whether this is the last is asked anew.
            self._on_schedule(self.state.step == cfg.train.steps, reporter, clock)
            window.resume()
        if not self.evaluations.last:
            self._evaluate(reporter, clock)
        self.checkpoints.wait()
        progress.elapsed_s = clock.elapsed()
        return self.summary()

    def _log_window(self, window: WindowClock, reporter: Reporter, clock: RunClock) -> None:
        self.progress.train_s += window.busy
        self.components.at("window", self.state.step)
        extra = {LR: window.lr, LOSS_SCALE: self.precision.loss_scale,
                 **self.strategy.window_figures(window.steps, window.passes),
                 **self.components.metrics()}
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
            self.calibration.relink(self.state.step, reporter)
        if decision.stop:
            self._stop(reporter, clock, decision.stop == PreemptionFlag.INTERRUPT)
        if bad := decision.rollback_before:
            self._rollback(bad, f"loss spike at step {bad}", reporter)

    def _evaluate(self, reporter: Reporter, clock: RunClock) -> bool:
        """Evaluate now (`Evaluations.guarded`); whether the target was reached."""
        return self.evaluations.guarded(self.state.step, self.progress, reporter, clock,
                                        self.checkpoints, lambda: self.save(reporter, clock))

    def _on_schedule(self, last: bool, reporter: Reporter, clock: RunClock) -> None:
        """Checkpoint and evaluate when the config says so. The last checkpoint is taken
        before the last evaluation (which overlaps its write): a failing one loses nothing."""
        cfg, step, evals = self.config, self.state.step, self.evaluations
        every = cfg.checkpoint.every
        save_now = (every and step % every == 0) or (last and cfg.checkpoint.at_end)
        if save_now and last:
            self.save(reporter, clock)
        if evals.due(step, last):
            reached = self._evaluate(reporter, clock)
            if reached and save_now and last:
                self.save(reporter, clock)  # the checkpoint must know the target is met
            if reached and cfg.train.stop_at_target and not last:
                self.stopped_at_target = True  # every rank saw the same reduced values
                if cfg.checkpoint.at_end:
                    self.save(reporter, clock)
                return
        if save_now and not last:
            self.save(reporter, clock)

    def close(self) -> None:
        """Finish a checkpoint in flight, close the components, give SIGTERM back."""
        try:
            self.checkpoints.close()
        except CheckpointError as err:
            log.error("%s", err)
        finally:
            try:
                self.components.close()
            finally:
                self.preemption.close()

    def export(self) -> torch.nn.Module | None:
        """The trained model, owned by no process group (`exported`). All ranks."""
        return exported(self.strategy, self.task.model, self.components)

    def summary(self) -> dict[str, Any]:
        """The run's outcome as JSON-ready values."""
        return summary_of(self.run_dir, self.state.step, self.config, self.runtime.world_size,
                          self.batches, self.progress, self.evaluations, self.calibration.seconds,
                          self.monitor.percentiles(), self.task.tokens_per_sample,
                          self.started_at, load_seconds(self.data.dataset, self.data.eval_dataset))

