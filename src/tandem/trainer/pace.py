"""How the ranks move through the run's steps between the loop's sync points.

- Lockstep (every plan but one): each stretch is one optimizer step that every rank takes
  together, each on its share of the global batch.
- Free running (`plan.strategy async`): between two sync points (the next step at which the
  loop logs a window, evaluates, checkpoints, calibrates or ends) each worker takes local
  steps at its own pace, each on one share of one global batch (`tandem.data.claims`), with
  that global step's learning rate and seed. The stretch ends when every share before the
  sync point is taken; after a barrier every rank stands at that step together. A share
  is claimed when its worker is free and loaded then, in the worker's own process:
  `data.workers` (loader processes) has nothing to prefetch here and is not used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from tandem.data.loader import to_device
from tandem.data.sampler import Cursor, epoch_order, rank_slice
from tandem.runtime import seed_step
from tandem.trainer.data import micro_batches

log = logging.getLogger("tandem")

if TYPE_CHECKING:
    from tandem.trainer.loop import Trainer
    from tandem.trainer.progress import Reporter
    from tandem.trainer.timing import WindowClock


class LockstepPace:
    """Every rank takes each optimizer step together."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.batches: Any = None

    def start(self) -> None:
        """Open this segment's data at the trainer's cursor and step."""
        t = self.t
        self.batches = micro_batches(t.data, t.config, t.layout.dp_rank, t.progress.cursor,
                                     t.state.step, t.runtime.device, lambda: t.state.step)

    def stretch(self, window: WindowClock, reporter: Reporter) -> str | None:
        """One optimizer step; the reason to roll back, when it asks for one."""
        t, state = self.t, self.t.state
        loss, norm, skipped, size, started = train(t, self.batches, state.step,
                                                   t.layout.dp_rank, window)
        state.step += 1
        # Step time includes a low-communication meeting, as the window's time/step does.
        t.monitor.clock.begin("comm", on_device=True)
        t.strategy.after_step(state.step, last=state.step == t.config.train.steps)
        t.monitor.clock.end()
        t.components.after_step(state.step, skipped)
        t.monitor.step(loss, norm, time.perf_counter() - started, size)
        t.progress.consume(size, len(t.data.dataset))
        return on_skip(t, norm, state.step - 1, reporter) if skipped else None


def train(t: Trainer, batches: Iterator[Any], step: int, slot: int,
          window: WindowClock) -> tuple[Any, Any, bool, int, float]:
    """Global step `step`'s update from its share `slot` (a data-parallel rank's: all of
    the rank's micro-batches); (loss, gradient norm, skipped, the step's global batch,
    when it started)."""
    t.components.at("step", step)
    # Tensor-parallel peers draw the same numbers (they compute one replica together).
    seed_step(t.config.run.seed, slot, step)
    window.lr = t.lr.apply(step)
    size = t.batches.size_at(step)
    started = time.perf_counter()
    loss, norm, skipped, passes = t.steps.run(batches, step)
    window.add_step(passes)
    return loss, norm, skipped, size, started


def on_skip(t: Trainer, norm: Any, step: int, reporter: Reporter) -> str | None:
    """An update skipped for non-finite gradients: raise, the reason to roll back, or
    None (recorded) as fault.nonfinite says."""
    reason = f"non-finite gradient norm ({norm.item()}) at step {step}"
    if t.config.fault.nonfinite == "raise":
        raise FloatingPointError(reason + " (fault.nonfinite = 'raise')")
    if t.config.fault.nonfinite == "rollback":
        return reason
    reporter.event(step, "skip", f"{reason}: the update was skipped")
    return None


class AsyncPace(LockstepPace):
    """Workers take local steps at their own pace between sync points (module doc)."""

    def start(self) -> None:
        """Hand out the shares from the trainer's step on. All ranks."""
        t = self.t
        self.first = t.state.step
        self.positions: list[tuple[int, int]] = []  # (epoch, start) of global steps
        self.cursor = Cursor(epoch=t.progress.cursor.epoch, offset=t.progress.cursor.offset)
        self.order: tuple[int, Any] | None = None
        self.world = t.batches.dp_size
        if t.config.data.workers and t.runtime.rank == 0:
            log.warning("data.workers = %d is not used by plan.strategy async: each share is "
                        "loaded when a worker claims it, in that worker's process",
                        t.config.data.workers)
        t.strategy.begin(t.state.step)

    def _boundary(self) -> int:
        """The next step at which the loop needs every rank."""
        t = self.t
        cfg, b = t.config, t.state.step + 1
        while not (b % cfg.monitor.log_every == 0 or b >= cfg.train.steps
                   or t.evaluations.due(b, False)
                   or (cfg.checkpoint.every and b % cfg.checkpoint.every == 0)
                   or b - self.first == cfg.monitor.calibrate_at):
            b += 1
        return b

    def _ids(self, step: int, slot: int) -> list[int]:
        t = self.t
        size, length = t.batches.global_batch, len(t.data.dataset)
        while len(self.positions) <= step - self.first:
            self.positions.append(self.cursor.take(size, length))
        epoch, start = self.positions[step - self.first]
        if self.order is None or self.order[0] != epoch:
            order = (t.data.order(t.config.run.seed, epoch) if t.data.order is not None
                     else epoch_order(t.config.run.seed, epoch, length))
            self.order = (epoch, order)
        batch = self.order[1][start:start + size]
        return batch[rank_slice(size, slot, t.batches.dp_size)].tolist()

    def _share(self, step: int, slot: int) -> Iterator[Any]:
        t = self.t
        ids, micro = self._ids(step, slot), t.batches.micro
        for k in range(0, len(ids), micro):
            samples = [t.data.dataset[i] for i in ids[k:k + micro]]
            yield to_device(t.data.collate(samples), t.runtime.device)

    def stretch(self, window: WindowClock, reporter: Reporter) -> str | None:
        """Local steps until every share before the next sync point is taken; then every
        rank stands at that step. All ranks."""
        t, strategy = self.t, self.t.strategy
        limit = self._boundary()
        while strategy.ready(lambda: not strategy.claims.available(limit)):
            share = strategy.claims.claim(limit)
            if share is None:
                break
            step, slot = share
            loss, norm, skipped, size, started = train(t, self._share(step, slot), step,
                                                       slot, window)
            t.monitor.clock.begin("comm")
            strategy.after_local_step()
            t.monitor.clock.end()
            t.components.after_step(step + 1, skipped)
            # A local step trains on one share: the samples it adds are the share's.
            t.monitor.step(loss, norm, time.perf_counter() - started, size // self.world)
            if skipped:  # validation refuses fault.nonfinite 'rollback' with async
                on_skip(t, norm, step, reporter)
        if limit >= t.config.train.steps:
            strategy.finish()
        dist.barrier()  # every share before `limit` is trained
        for done in range(t.state.step, limit):
            t.progress.consume(t.batches.size_at(done), len(t.data.dataset))
        t.state.step = limit
        return None


def pace_of(trainer: Trainer) -> LockstepPace:
    """The pace the trainer's strategy asks for."""
    return (AsyncPace if trainer.strategy.info.free_running else LockstepPace)(trainer)
