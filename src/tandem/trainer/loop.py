"""The step engine: build the run from a Task and a Config, train, evaluate, checkpoint."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import torch

from tandem import parallel
from tandem.config import Config, parse_ramp, parse_target
from tandem.data.loader import train_batches
from tandem.data.sampler import GlobalBatchSampler, check_sizes, split_batch
from tandem.faults import FaultPlan
from tandem.monitor.calibrate import calibrate
from tandem.monitor.heartbeat import Heartbeat
from tandem.monitor.live import LiveMonitor
from tandem.monitor.progress import Reporter
from tandem.monitor.system import state_bytes
from tandem.optim.schedule import LrController
from tandem.parallel import fsdp, tensor
from tandem.parallel.lowcomm import LowCommSync
from tandem.runtime import Runtime, derive_seed, seed_all, seed_step
from tandem.task import Task
from tandem.trainer import recovery
from tandem.trainer.evaluate import evaluate
from tandem.trainer.guard import PreemptionFlag, agree
from tandem.trainer.precision import Precision
from tandem.trainer.state import TrainState

log = logging.getLogger("tandem")

TARGET_SLACK = 1e-6  # relative tolerance of train.target comparisons (float32 metrics)


class Trainer:
    """One training run of a Task under a Config on this process's Runtime."""

    def __init__(self, task: Task, config: Config, runtime: Runtime, run_dir: Path) -> None:
        self.task = task
        self.config = config
        self.runtime = runtime
        self.run_dir = run_dir
        train = config.train
        # Ranks on a (data-parallel x tensor-parallel) mesh; without tensor parallelism
        # the data-parallel rank and size are the global ones.
        self.layout = tensor.layout(config.plan.tp, runtime.rank, runtime.world_size,
                                    runtime.device)
        self.micro, self.accum = split_batch(train.global_batch, train.micro_batch,
                                             self.layout.dp_size)
        self.ramp = parse_ramp(train.batch_ramp, train.global_batch) if train.batch_ramp else []
        for _, size in self.ramp:
            if size % (self.micro * self.layout.dp_size):
                raise ValueError(
                    f"train.batch_ramp: batch {size} is not a multiple of micro-batch "
                    f"{self.micro} x {self.layout.dp_size} data-parallel processes; the ramp "
                    "grows the batch by accumulation, so each batch must be one")
        # Same value on every rank and at every world size: the same data and the same
        # initial weights as a one-process run.
        seed_all(derive_seed("build", config.run.seed))
        self.dataset = task.train_data()
        for _, size in self.ramp:
            check_sizes(len(self.dataset), size, self.micro * self.layout.dp_size)  # type: ignore[arg-type]
        self.eval_dataset = task.eval_data() if task.eval_data is not None else None
        self.model = parallel.wrap(task.model(), config.plan, runtime, self.layout,
                                   task.tensor_parallel)
        self.strategy = parallel.resolve_strategy(config.plan, runtime)
        self.lowcomm = (LowCommSync(self.model, method=self.strategy,
                                    every=config.plan.sync_every,
                                    outer_lr=config.plan.outer_lr,
                                    outer_momentum=config.plan.outer_momentum)
                        if self.strategy in ("localsgd", "diloco") else None)
        self.optimizer = task.optimizer(self.model.parameters())
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.grad_sync = (tensor.GradientSync(self.params, self.layout.dp_group,
                                              self.layout.dp_size)
                          if self.strategy == "tp" else None)
        self.lr = LrController(self.optimizer, config.optim, train.steps, train.global_batch,
                               self.batch_at if self.ramp else None)
        self.precision = Precision(config.precision, runtime.device)
        self.state = TrainState()
        self.target = parse_target(train.target) if train.target else None
        self.last_eval: dict[str, float] = {}
        self.last_saved = -1
        self.last_batch: Any = None
        self.eval_s = 0.0  # evaluation time of this attempt
        self.faults = FaultPlan.from_env(runtime.rank, runtime.restart_count)
        self.preemption = PreemptionFlag()
        self.heartbeat = Heartbeat(runtime.store, runtime.rank, runtime.world_size,
                                   config.fault.heartbeat_s)
        self.guard_nonfinite = config.precision.mode != "fp16"
        self.monitor = LiveMonitor(
            device=runtime.device, rank=runtime.rank, world_size=runtime.world_size,
            log_every=config.monitor.log_every, tokens_per_sample=task.tokens_per_sample,
            timing=config.monitor.timing, sharded=self.strategy == "fsdp")

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
            "strategy": parallel.resolve_strategy(cfg.plan, self.runtime),
            "world_size": self.runtime.world_size,
            "data_parallel": self.layout.dp_size,
            "tensor_parallel": self.layout.tp_size,
            "micro_batch": self.micro,
            "accumulation": self.accum,
            "batch_ramp": cfg.train.batch_ramp,
            "activation_checkpointing": cfg.plan.activation_checkpointing,
            "compile": cfg.plan.compile,
            "bucket_mb": cfg.plan.bucket_mb,
            "precision": cfg.precision.mode,
            "data_workers": cfg.data.workers,
            "device": str(self.runtime.device),
        }

    def resume(self) -> Path | None:
        """Load the latest good checkpoint, as `run.resume` says. All ranks."""
        found = recovery.resume(self)
        self.lr.extra = self.state.lr_scale
        return found

    # ------------------------------------------------------------------ steps
    def _train_step(self, batches: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """One optimizer step over `accum` micro-batches.

        Returns (summed micro-batch losses, gradient norm, whether the update was
        skipped because the gradients were not finite).
        """
        task, model, precision, clock = self.task, self.model, self.precision, self.monitor.clock
        factor = self.faults.loss_factor(self.state.step) if self.faults is not None else None
        total = torch.zeros((), device=self.runtime.device)
        accum = self.batch_at(self.state.step) // (self.micro * self.layout.dp_size)
        for k in range(accum):
            self._fault("data")
            clock.begin("data")
            batch = self._next_batch(batches)
            clock.end()
            self.last_batch = batch
            self._fault("compute")
            sync = parallel.no_sync(model) if k < accum - 1 else contextlib.nullcontext()
            with sync:
                clock.begin("forward", on_device=True)
                with precision.autocast():
                    loss = task.loss(task.run_forward(model, batch), batch)
                if factor is not None:  # an injected NaN or loss spike
                    loss = loss * factor
                clock.end()
                # Mean over the micro-batch / accum, then DDP's mean over ranks: the
                # gradient of the mean loss over the whole global batch.
                clock.begin("backward", on_device=True)
                precision.backward(loss / accum)
                clock.end()
            total += loss.detach().float()
        if self.grad_sync is not None:  # tensor parallel: average over the data-parallel group
            clock.begin("backward", on_device=True)
            self.grad_sync()
            clock.end()
        self._fault("optim")
        clock.begin("optim", on_device=True)
        # Tensor parallel: DTensor and plain (replicated) parameters meet in one optimizer.
        mixed = tensor.mixed_ops() if self.grad_sync is not None else contextlib.nullcontext()
        with mixed:
            norm = precision.grad_norm(self.optimizer, self.params, self.config.train.grad_clip)
            # The norm is of the all-reduced gradient, so every rank takes the same branch.
            # fp16 leaves this to its loss scaler, for which an overflow is routine.
            skip = self.guard_nonfinite and not bool(torch.isfinite(norm))
            if not skip:
                # Once per window: how far the update moved the weights, relative to them.
                measure = self.config.monitor.timing and self.monitor.wants_update_ratio(
                    self.state.step)
                before = self.monitor.snapshot(self.params) if measure else None
                precision.step(self.optimizer)
                if before is not None:
                    self.monitor.update_sizes(before, self.params)
        self.optimizer.zero_grad(set_to_none=True)
        clock.end()
        return total / accum, norm, skip

    def _next_batch(self, batches: Any) -> Any:
        try:
            return next(batches)
        except (RuntimeError, OSError, EOFError) as err:
            # A dead DataLoader worker surfaces as any of these, depending on timing.
            raise RuntimeError(f"loading the batch of step {self.state.step} failed "
                               f"({type(err).__name__}: {err}); the last committed "
                               f"checkpoint is intact") from err

    def _calibrate(self, reporter: Reporter) -> None:
        """Measure exposed communication, FLOPs and peak on the last micro-batch. All ranks."""
        model, task, batch = self.model, self.task, self.last_batch
        buffers = {name: b.detach().clone() for name, b in model.named_buffers()}

        def one_pass(sync: bool) -> None:
            context = contextlib.nullcontext() if sync else parallel.no_sync(model)
            with context:
                with self.precision.autocast():
                    loss = task.loss(task.run_forward(model, batch), batch)
                loss.backward()
            self.optimizer.zero_grad(set_to_none=True)

        # A comm hook with memory (PowerSGD's error feedback, top-k residuals, their step
        # counters) must not remember the calibration passes: put its state back after.
        stats = parallel.comm_stats(model)
        saved = stats.save() if stats is not None else None
        try:
            figures = calibrate(one_pass, device=self.runtime.device,
                                world_size=self.runtime.world_size, accum=self.accum,
                                grad_bytes=sum(p.numel() * p.element_size() for p in self.params),
                                precision=self.config.precision.mode,
                                synchronised=self.strategy == "ddp")
        finally:
            if stats is not None and saved is not None:
                stats.restore(saved)
            if fsdp.is_sharded(model):
                # FSDP2 keeps no-sync gradients outside p.grad, where zero_grad cannot
                # reach them, until the next synchronised backward: consume them here.
                one_pass(True)
            with torch.no_grad():
                for name, value in model.named_buffers():
                    value.copy_(buffers[name])
        figures.update(state_bytes(model, self.optimizer))
        self.monitor.static.update(figures)
        reporter.record(self.state.step, figures)

    def _fault(self, phase: str) -> None:
        """Act out an injected fault planned for this phase of this step, if any."""
        if self.faults is not None:
            self.heartbeat.at(self.state.step, phase)
            self.faults.hit(phase, self.state.step)

    def _evaluate(self) -> dict[str, float]:
        if self.eval_dataset is None:
            return {}
        values = evaluate(self.task, parallel.unwrap(self.model), self.eval_dataset,
                          self.runtime, self.config.train.eval_batch, self.config.data,
                          self.precision, self.layout)
        return {f"eval_{k}" if k == "loss" else k: v for k, v in values.items()}

    def _check_target(self, values: dict[str, float], elapsed: float) -> bool:
        if self.target is None or self.state.target_reached is not None:
            return False
        metric, op, goal = self.target
        value = values.get(metric)
        if value is None:
            raise ValueError(
                f"train.target names {metric!r}, which evaluation does not produce; "
                f"it produces {sorted(values)}"
            )
        # Metrics are float32 means: 470/500 correct comes out as 0.93999999, which must
        # still count for 'accuracy>=0.94'. A relative slack of 1e-6 absorbs that.
        slack = TARGET_SLACK * max(1.0, abs(goal))
        if (value >= goal - slack) if op == ">=" else (value <= goal + slack):
            self.state.target_reached = {"step": self.state.step, "elapsed_s": elapsed,
                                         "value": value}
            return True
        return False

    # -------------------------------------------------------------------- run
    def run(self, reporter: Reporter) -> dict[str, Any]:
        """Train to `train.steps`, evaluating and checkpointing on schedule. All ranks."""
        cfg, rt = self.config, self.runtime
        sampler = GlobalBatchSampler(
            dataset_len=len(self.dataset),  # type: ignore[arg-type]
            global_batch=cfg.train.global_batch, accum=self.accum, rank=self.layout.dp_rank,
            world_size=self.layout.dp_size, seed=cfg.run.seed, cursor=self.state.cursor,
            batch_at=self.batch_at if self.ramp else None, step=self.state.step,
        )
        batches = train_batches(self.dataset, sampler, cfg.data, rt.device)
        clock = _Clock(self.state.elapsed_s)
        window = _Window()
        self.model.train()
        while self.state.step < cfg.train.steps:
            self._one_step(batches, window, reporter, sampler.dataset_len)
            last = self.state.step == cfg.train.steps
            window.pause()  # logging, evaluation and checkpoints are not training time
            if self.state.step % cfg.monitor.log_every == 0 or last:
                self._log_window(window, reporter, clock)
            else:
                reporter.advance(self.state.step)
            # After a rollback the step went back: `last` is recomputed, not reused.
            self._on_schedule(self.state.step == cfg.train.steps, reporter, clock)
            window.resume()
        if not self.last_eval:
            self.last_eval = self._evaluate()
        self.state.elapsed_s = clock.elapsed()
        return self.summary()

    def _one_step(self, batches: Any, window: _Window, reporter: Reporter,
                  dataset_len: int) -> None:
        cfg, state = self.config, self.state
        self.heartbeat.at(state.step, "step")
        self._fault("step")
        # Tensor-parallel peers draw the same numbers (they compute one replica together).
        seed_step(cfg.run.seed, self.layout.dp_rank, state.step)
        window.lr = self.lr.apply(state.step)
        size = self.batch_at(state.step)
        started = time.perf_counter()
        loss, norm, skipped = self._train_step(batches)
        window.steps += 1
        state.step += 1
        if self.lowcomm is not None:
            meeting = time.perf_counter()
            self.lowcomm.after_step(state.step, force=state.step == cfg.train.steps)
            window.comm_s += time.perf_counter() - meeting
        # Step time includes a low-communication meeting, as the window's time/step does.
        self.monitor.step(loss, norm, time.perf_counter() - started, size)
        state.cursor.take(size, dataset_len)
        state.samples += size
        if state.step == cfg.monitor.calibrate_at:
            self._calibrate(reporter)
        if skipped:
            reason = f"non-finite gradient norm ({norm.item()}) at step {state.step - 1}"
            if cfg.fault.nonfinite == "raise":
                raise FloatingPointError(reason + " (fault.nonfinite = 'raise')")
            if cfg.fault.nonfinite == "rollback":
                recovery.rollback(self, state.step - 1, reason, reporter)
            else:
                reporter.event(state.step - 1, "skip", f"{reason}: the update was skipped")

    def _log_window(self, window: _Window, reporter: Reporter, clock: _Clock) -> None:
        self.state.train_s += window.busy
        self.heartbeat.at(self.state.step, "window")
        extra = {"lr": window.lr, "loss_scale": self.precision.loss_scale}
        if self.lowcomm is not None and window.steps:
            extra["time/comm_exposed"] = window.comm_s / window.steps
            extra["comm/bytes_per_step"] = self.lowcomm.take_bytes() / window.steps
        stats = parallel.comm_stats(self.model)
        if stats is not None and (stats.steps or stats.fixed_bytes is not None):
            # What the DDP comm hook actually sent (DDP's own all-reduce: from the sizes).
            extra["comm/bytes_per_step"] = stats.bytes_per_step()
        if self.strategy == "fsdp":  # FSDP2 counts nothing itself: from the sizes
            plan = self.config.plan
            extra["comm/bytes_per_step"] = fsdp.bytes_per_step(
                self.model, self.runtime.world_size, self.accum, plan.fsdp_reshard,
                parallel.DTYPES[plan.fsdp_param_dtype], parallel.DTYPES[plan.fsdp_reduce_dtype])
        if self.grad_sync is not None and self.grad_sync.steps:
            extra["comm/bytes_per_step"] = self.grad_sync.bytes_per_step()
        closed = self.monitor.close(self.state.step, window.busy, extra)
        window.clear()
        spike = 0
        if closed is not None:
            reporter.window(closed)
            spikes = [e.step for e in closed.events if e.kind == "loss_spike"]
            if spikes and self.config.fault.spike == "rollback":
                spike = min(spikes)
        decision = agree(self.preemption.requested, spike, self.runtime.device)
        if decision.preempt:
            self.state.elapsed_s = clock.elapsed()
            recovery.preempt(self, reporter)
        if decision.rollback_before:
            recovery.rollback(self, decision.rollback_before,
                              f"loss spike at step {decision.rollback_before}", reporter)

    def _on_schedule(self, last: bool, reporter: Reporter, clock: _Clock) -> None:
        """Evaluate and checkpoint when the config says so."""
        cfg, state = self.config, self.state
        if last or (cfg.train.eval_every and state.step % cfg.train.eval_every == 0):
            self.heartbeat.at(state.step, "eval")
            self._fault("eval")
            elapsed = clock.elapsed()
            self.last_eval = self._evaluate()
            self.eval_s += clock.elapsed() - elapsed
            if self.last_eval:
                reporter.evaluation(state.step, self.last_eval)
            if self._check_target(self.last_eval, elapsed):
                reporter.event(state.step, "target",
                               f"target {cfg.train.target} reached at step {state.step} "
                               f"after {elapsed:.1f} s")
        every = cfg.checkpoint.every
        if (every and state.step % every == 0) or (last and cfg.checkpoint.at_end):
            self.heartbeat.at(state.step, "checkpoint")
            state.elapsed_s = clock.elapsed()
            recovery.save(self, reporter)

    def close(self) -> None:
        """Stop the liveness thread and give SIGTERM back."""
        self.heartbeat.close()
        self.preemption.close()

    def describe_ranks(self) -> str:
        """Where every rank was last seen (for hang reports)."""
        return self.heartbeat.describe()

    def summary(self) -> dict[str, Any]:
        """The run's outcome as JSON-ready values."""
        state, cfg = self.state, self.config
        summary: dict[str, Any] = {
            "name": self.run_dir.name,
            "steps": state.step,
            "world_size": self.runtime.world_size,
            "global_batch": cfg.train.global_batch,
            "micro_batch": self.micro,
            "accumulation": self.accum,
            "wall_time_s": state.elapsed_s,
            "eval_time_s": self.eval_s,
            "samples_per_s": state.samples / state.train_s if state.train_s else 0.0,
            **self.monitor.percentiles(),
            **self.last_eval,
        }
        if self.task.tokens_per_sample:
            summary["tokens_per_s"] = summary["samples_per_s"] * self.task.tokens_per_sample
        if state.target_reached is not None:
            summary["time_to_target_s"] = state.target_reached["elapsed_s"]
            summary["target"] = f"{cfg.train.target} at step {state.target_reached['step']}"
        elif self.target is not None:
            summary["target"] = f"{cfg.train.target} not reached"
        summary["run_dir"] = str(self.run_dir)
        return summary



class _Clock:
    """Wall time of the run over all its attempts."""

    def __init__(self, before: float) -> None:
        self.before = before
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return self.before + time.perf_counter() - self.start


class _Window:
    """Steps and training time since the last log line."""

    def __init__(self) -> None:
        self.steps = 0
        self.comm_s = 0.0  # low-communication meetings (DDP's is inside backward)
        self.lr = 0.0
        self.busy = 0.0
        self.start = time.perf_counter()

    def pause(self) -> None:
        """Stop counting: what follows is not a training step."""
        self.busy += time.perf_counter() - self.start

    def resume(self) -> None:
        """Count again from now."""
        self.start = time.perf_counter()

    def clear(self) -> None:
        self.steps = 0
        self.comm_s = 0.0
        self.busy = 0.0

