"""The step engine: build the run from a Task and a Config, train, evaluate, checkpoint.

The Trainer sequences the run's parts: the strategy (how the model is spread and how a
step's passes run), the components (what capabilities add, in order) and the trainer's
own state. The checkpoint's states and a rollback's set are derived from that one list.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint import CheckpointError, CheckpointManager, ModelWeights, OptimizerState
from tandem.components import Chain, Component, RunParts
from tandem.components.base import Held, checkpoint_states, rollback_names
from tandem.components.builtin import builtin
from tandem.components.liveness import Liveness
from tandem.config import Config, parse_ramp, parse_target
from tandem.data.batches import BatchPlan
from tandem.data.loader import to_device, train_batches
from tandem.data.memory import held
from tandem.data.sampler import GlobalBatchSampler, check_sizes
from tandem.data.seqlen import SeqRamp
from tandem.losses import training_task
from tandem.monitor.live import LiveMonitor
from tandem.monitor.progress import Reporter
from tandem.optim.schedule import LrController
from tandem.parallel import build_strategy, plan_layout
from tandem.runtime import Runtime, derive_seed, seed_all, seed_step
from tandem.task import Task
from tandem.trainer import preflight, restore
from tandem.trainer.calibration import Calibration
from tandem.trainer.evaluations import Evaluations
from tandem.trainer.guard import STATUS_FILE_ENV, Interrupted, Preempted, PreemptionFlag, agree
from tandem.trainer.precision import Precision
from tandem.trainer.resumed import Resumed, optimizer_record
from tandem.trainer.state import Progress, TrainState
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
        self.layout = plan_layout(config.plan, runtime)
        self.strategy = build_strategy(config.plan, runtime, self.layout, config.run.seed)
        with preflight.stage():
            own = list(task.components()) if task.components is not None else []
            self.components = Chain([*builtin(config, runtime), *own, *components])
        try:
            self._build()
        except BaseException:
            self.components.close()
            raise

    def _build(self) -> None:
        task, config, runtime = self.task, self.config, self.runtime
        with preflight.stage():
            model = self._build_data_and_model()
            model = self.components.transform_model(model, runtime.device)
        self.model = self.strategy.distribute(model, task.tensor_parallel)
        with preflight.stage():
            self.optimizer = preflight.check_optimizer(task.optimizer(self.model.parameters()))
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            share = getattr(self.optimizer, "share_work", None)  # e.g. Muon
            if share is not None and self.strategy.identical_replicas and self.layout.dp_size > 1:
                share(self.layout.dp_group, self.strategy.shared_memory())
            self.lr = LrController(self.optimizer, config.optim, config.train.steps,
                                   config.train.global_batch,
                                   self.batches.size_at if self.batches.ramp else None)
            self.precision = Precision(config.precision, runtime.device)
            target = parse_target(config.train.target) if config.train.target else None
            preflight.check_target(target, task.metrics, self.eval_dataset is not None)
            batch = preflight.first_batch(self.dataset, list(range(self.batches.micro)))
        batch = to_device(batch, runtime.device)
        with preflight.stage():
            preflight.check_step(task, self.strategy.module, batch, self.precision.autocast)
        self.components.setup(RunParts(self.model, self.strategy.module, self.optimizer,
                                       runtime.device, self.strategy.weights_replaced))
        self.state, self.progress = TrainState(), Progress()
        self.started_at: float | None = None  # when this attempt's training began
        self.stopped_at_target = False  # train.stop_at_target ended the run early
        self.preemption = PreemptionFlag(announce=runtime.is_main)
        self.monitor = LiveMonitor(
            device=runtime.device, rank=runtime.rank, world_size=runtime.world_size,
            log_every=config.monitor.log_every, tokens_per_sample=task.tokens_per_sample,
            timing=config.monitor.timing, sharded=self.strategy.shards_weights,
            measures_comm=self.strategy.times_comm)
        self.steps = StepRunner(StepParts(
            task=self.train_task, config=config, model=self.model, optimizer=self.optimizer,
            params=self.params, strategy=self.strategy, precision=self.precision,
            monitor=self.monitor, batches=self.batches, device=runtime.device,
            components=self.components))
        self.calibration = Calibration(self.steps.p)
        self.evaluations = Evaluations(task, self.eval_dataset, config, runtime, self.strategy,
                                       self.precision, self.layout, self.components, target)
        # The trainer's own state, then the components': what a checkpoint holds, and
        # (those that say where the weights are) what a rollback restores.
        parts = [Held("model", ModelWeights(self.model), True),
                 Held("optim", OptimizerState(self.model, self.optimizer), True),
                 Held("strategy", self.strategy, True), Held("precision", self.precision, True),
                 Held("train", self.state, True), Held("progress", self.progress, False),
                 *self.components.components]
        self.rollback_states = rollback_names(parts)
        self.checkpoints = CheckpointManager(
            self.run_dir / "checkpoints", checkpoint_states(parts), keep=config.checkpoint.keep,
            asynchronous=config.checkpoint.async_save, device=runtime.device,
            timeout_s=config.plan.timeout_s, hook=self.components.after_checkpoint)

    def _build_data_and_model(self) -> torch.nn.Module:
        """Batch split, datasets and the model factory: local checks only."""
        task, train = self.task, self.config.train
        ramp = parse_ramp(train.batch_ramp, train.global_batch) if train.batch_ramp else []
        self.batches = BatchPlan.of(train.global_batch, train.micro_batch, self.layout.dp_size,
                                    ramp)
        if self.config.plan.static_graph and (self.batches.accum > 1 or ramp):
            raise ValueError(
                f"plan.static_graph: true with {self.batches.accum} accumulation passes a "
                "step (or a batch ramp) fails inside DDP's reducer, which expects every "
                "parameter once per step; keep one: static_graph false, or train.micro_batch 0")
        # Same value on every rank and at every world size: the same data and the same
        # initial weights as a one-process run.
        seed_all(derive_seed("build", self.config.run.seed))
        self.train_task = training_task(task, train.label_smoothing)
        self.dataset = task.train_data()
        preflight.check_dataset(self.dataset, "train_data")
        self.dataset = held(self.dataset, self.config.data, "train_data")
        for size in self.batches.sizes:
            check_sizes(len(self.dataset), size, self.batches.micro * self.layout.dp_size)  # type: ignore[arg-type]
        self.eval_dataset = task.eval_data() if task.eval_data is not None else None
        if self.eval_dataset is not None:
            preflight.check_dataset(self.eval_dataset, "eval_data")
            self.eval_dataset = held(self.eval_dataset, self.config.data, "eval_data")
        return self.strategy.build(task.model)

    def plan(self) -> dict[str, Any]:
        """The execution plan in force: how the work is spread and computed."""
        return plan_of(self.config, self.strategy, self.layout, self.batches, self.precision,
                       self.runtime.world_size, self.runtime.device)

    def run_id(self, fresh: str) -> str:
        """The run's id in the run store: the one it resumed with, else `fresh` (kept)."""
        self.progress.run_id = self.progress.run_id or fresh
        return self.progress.run_id

    # ------------------------------------------------------------ checkpoints
    def resume(self) -> Resumed:
        """Load the latest good checkpoint as `run.resume` says (`restore.resume`). All ranks."""
        cfg = self.config
        loaded = restore.resume(
            self.checkpoints, cfg, self.run_dir, optimizer_record(self.optimizer),
            self.components.optional,
            lambda: self.state.step >= cfg.train.steps or (
                cfg.train.stop_at_target and self.progress.target_reached is not None))
        for name in loaded.fresh:  # e.g. averaging switched on at this resume
            self.components.named(name).fresh_start()
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
        self.progress.elapsed_s = clock.elapsed()
        self.checkpoints.lineage = self.progress.run_id
        blocked = self.checkpoints.save(self.state.step, {
            "config": self.config.to_dict(), "world_size": self.runtime.world_size,
            "optimizer": optimizer_record(self.optimizer)})
        reporter.record(self.state.step, {"time/checkpoint_blocking_s": blocked})

    def _stop(self, reporter: Reporter, clock: RunClock, interrupt: bool) -> None:
        """Commit a checkpoint at this step boundary and stop with a resumable status."""
        if self.checkpoints.last_step != self.state.step:
            self.save(reporter, clock)
        path = self.checkpoints.wait() or self.checkpoints.root / f"step_{self.state.step:09d}"
        kind = "interrupted" if interrupt else "preempted"
        reporter.event(self.state.step, kind,
                       f"{kind}: checkpoint {path} committed at step {self.state.step}; "
                       "run the same command again to continue")
        status_file = os.environ.get(STATUS_FILE_ENV)
        if status_file and self.runtime.is_main:  # how `tandem run` learns why it stopped
            Path(status_file).write_text(f"{kind} {self.state.step}\n")
        raise (Interrupted if interrupt else Preempted)(self.state.step, str(path))

    # -------------------------------------------------------------------- run
    def run(self, reporter: Reporter) -> dict[str, Any]:
        """Train to `train.steps`, evaluating and checkpointing on schedule. All ranks."""
        cfg, rt, progress, plan = self.config, self.runtime, self.progress, self.batches
        sampler = GlobalBatchSampler(
            dataset_len=len(self.dataset),  # type: ignore[arg-type]
            global_batch=plan.global_batch, accum=plan.accum, rank=self.layout.dp_rank,
            world_size=self.layout.dp_size, seed=cfg.run.seed, cursor=progress.cursor,
            batch_at=plan.size_at if plan.ramp else None, step=self.state.step)
        batches = train_batches(self.dataset, sampler, cfg.data, rt.device)
        if cfg.train.seq_ramp:
            batches = SeqRamp(cfg.train.seq_ramp).apply(batches, lambda: self.state.step)
        clock, window = RunClock(progress.elapsed_s), WindowClock()
        self.started_at = time.time()
        self.model.train()
        # Calibration counts from this segment's first step: a resumed or resized run
        # measures again (its size, its link and its step may be another run's).
        first = self.state.step
        while self.state.step < cfg.train.steps and not self.stopped_at_target:
            self._one_step(batches, window, reporter, sampler.dataset_len)
            window.pause()  # logging, evaluation and checkpoints are not training time
            if self.state.step - first == cfg.monitor.calibrate_at:
                self.calibration.run(self.steps.last_batch, plan.accum, self.state.step,
                                     reporter)
            if self.state.step % cfg.monitor.log_every == 0 or self.state.step == cfg.train.steps:
                self._log_window(window, reporter, clock)
            else:
                reporter.advance(self.state.step)
            # After a rollback the step went back: whether this is the last is asked anew.
            self._on_schedule(self.state.step == cfg.train.steps, reporter, clock)
            window.resume()
        if not self.evaluations.last:
            self.evaluations.final(self.state.step, progress, reporter, clock, self.checkpoints)
        self.checkpoints.wait()
        progress.elapsed_s = clock.elapsed()
        return self.summary()

    def _one_step(self, batches: Any, window: WindowClock, reporter: Reporter,
                  dataset_len: int) -> None:
        cfg, state = self.config, self.state
        self.components.at("step", state.step)
        # Tensor-parallel peers draw the same numbers (they compute one replica together).
        seed_step(cfg.run.seed, self.layout.dp_rank, state.step)
        window.lr = self.lr.apply(state.step)
        size = self.batches.size_at(state.step)
        started = time.perf_counter()
        loss, norm, skipped, passes = self.steps.run(batches, state.step)
        window.steps += 1
        window.passes += passes
        state.step += 1
        # Step time includes a low-communication meeting, as the window's time/step does.
        self.monitor.clock.begin("comm", on_device=True)
        self.strategy.after_step(state.step, last=state.step == cfg.train.steps)
        self.monitor.clock.end()
        self.components.after_step(state.step, skipped)
        self.monitor.step(loss, norm, time.perf_counter() - started, size)
        self.progress.consume(size, dataset_len)
        if skipped:
            reason = f"non-finite gradient norm ({norm.item()}) at step {state.step - 1}"
            if cfg.fault.nonfinite == "raise":
                raise FloatingPointError(reason + " (fault.nonfinite = 'raise')")
            if cfg.fault.nonfinite == "rollback":
                self._rollback(state.step - 1, reason, reporter)
            else:
                reporter.event(state.step - 1, "skip", f"{reason}: the update was skipped")

    def _log_window(self, window: WindowClock, reporter: Reporter, clock: RunClock) -> None:
        self.progress.train_s += window.busy
        self.components.at("window", self.state.step)
        extra = {"lr": window.lr, "loss_scale": self.precision.loss_scale,
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
        if decision.rollback_before:
            self._rollback(decision.rollback_before,
                           f"loss spike at step {decision.rollback_before}", reporter)

    def _on_schedule(self, last: bool, reporter: Reporter, clock: RunClock) -> None:
        """Checkpoint and evaluate when the config says so.

        The run's last checkpoint is taken before its last evaluation (which then
        overlaps the background write): an evaluation that fails cannot lose training.
        """
        cfg, step, evals = self.config, self.state.step, self.evaluations
        every = cfg.checkpoint.every
        save_now = (every and step % every == 0) or (last and cfg.checkpoint.at_end)
        if save_now and last:
            self.components.at("checkpoint", step)
            self.save(reporter, clock)
        if evals.due(step, last):
            reached = (evals.final(step, self.progress, reporter, clock, self.checkpoints)
                       if last else evals.run(step, self.progress, reporter, clock))
            if reached and save_now and last:
                self.save(reporter, clock)  # the checkpoint must know the target is met
            if reached and cfg.train.stop_at_target and not last:
                self.stopped_at_target = True  # every rank saw the same reduced values
                if cfg.checkpoint.at_end:
                    self.save(reporter, clock)
                return
        if save_now and not last:
            self.components.at("checkpoint", step)
            self.save(reporter, clock)

    def close(self) -> None:
        """Finish a checkpoint in flight, close the components, give SIGTERM back."""
        try:
            self.checkpoints.close()
        except CheckpointError as err:
            log.error("%s", err)
        finally:
            self.components.close()
            self.preemption.close()

    def describe_ranks(self) -> str:
        """Where every rank was last seen (for hang reports)."""
        live = [c for c in self.components.components if isinstance(c, Liveness)]
        return live[0].describe() if live else "no liveness records"

    def summary(self) -> dict[str, Any]:
        """The run's outcome as JSON-ready values."""
        return summary_of(self.run_dir, self.state.step, self.config, self.runtime.world_size,
                          self.batches, self.progress, self.evaluations, self.calibration.seconds,
                          self.monitor.percentiles(), self.task.tokens_per_sample,
                          self.started_at)


def export_model(trainer: Trainer) -> torch.nn.Module | None:
    """The trained weights (as the components' evaluation context shows them: their average
    under train.ema_decay) in a plain module that no process group owns. All ranks."""
    with trainer.components.evaluating():
        model = trainer.strategy.export_model(trainer.task.model)
        if trainer.components.swaps_weights and model is trainer.strategy.module:
            model = copy.deepcopy(model)  # the live module gets its own weights back
    return model
