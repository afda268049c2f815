"""The run's evaluations: when they happen, what they see (the components' evaluation
context, e.g. the weight average), and whether they met `train.target`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from tandem import checkpoint
from tandem.checkpoint import CheckpointManager
from tandem.components import Chain
from tandem.config import Config
from tandem.config.values import target_met
from tandem.data.loader import batch_size
from tandem.data.mixture import MixedDataset, Mixture, Source
from tandem.monitor.catalogue import EVAL_LOSS, LOSS, TASK_EVAL_LOSS, task_kind, task_metric
from tandem.parallel.mesh import Layout
from tandem.parallel.strategy import Strategy
from tandem.runtime import Runtime
from tandem.task import Task
from tandem.trainer.evaluate import EvaluationError, evaluate
from tandem.trainer.precision import Precision
from tandem.trainer.progress import Reporter
from tandem.trainer.state import Progress
from tandem.trainer.timing import RunClock

log = logging.getLogger("tandem")


class Evaluations:
    """Evaluates the run's model on `Task.eval_data`; records the target when met."""

    def __init__(self, task: Task, dataset: Any, config: Config, runtime: Runtime,
                 strategy: Strategy, precision: Precision, layout: Layout,
                 components: Chain, target: tuple[str, str, float] | None) -> None:
        self.task, self.dataset, self.config, self.runtime = task, dataset, config, runtime
        self.strategy, self.precision, self.layout = strategy, precision, layout
        self.components, self.target = components, target
        self.last: dict[str, float] = {}
        self.seconds = 0.0  # evaluation time of this attempt

    def due(self, step: int, last: bool) -> bool:
        """Whether the config asks for an evaluation after `step`."""
        train = self.config.train
        return bool(last or (train.eval_every and step % train.eval_every == 0
                             and step >= train.eval_from))

    def values(self) -> dict[str, float]:
        """Loss and metrics over the evaluation set (none without one). All ranks."""
        if self.dataset is None:
            return {}
        with self.strategy.evaluating(), self.components.evaluating():
            if isinstance(self.dataset, MixedDataset):
                values = self._per_source(self.dataset)
            else:
                values = self._evaluate(self.task, self.dataset)
        return {EVAL_LOSS if k == LOSS else k: v for k, v in values.items()}

    def _evaluate(self, task: Task, dataset: Any) -> dict[str, float]:
        return evaluate(task, self.strategy.module, dataset, self.runtime,
                        self.config.train.eval_batch, self.config.data, self.precision,
                        self.layout, views=self.config.train.eval_views)

    def _per_source(self, mixed: MixedDataset) -> dict[str, float]:
        """A mixture's evaluation: each source's data on its own, with its loss and
        metrics (task/NAME/...); the task's loss and metrics over all of them, each source
        weighted by its samples."""
        overall: dict[str, float] = {}
        out: dict[str, float] = {}
        total = len(mixed)
        for k, source in enumerate(mixed.mixture.sources):
            own = {task_metric(source.name, name): _seen_by(source, fn)
                   for name, fn in source.metrics.items()}
            values = self._evaluate(replace(self.task, metrics={**self.task.metrics, **own}),
                                    mixed.part(k))
            out[task_metric(source.name, task_kind(TASK_EVAL_LOSS))] = values[LOSS]
            out |= {name: values[name] for name in own}
            share = mixed.sizes[k] / total
            for name in [LOSS, *self.task.metrics]:
                overall[name] = overall.get(name, 0.0) + values[name] * share
        return {**overall, **out}

    def run(self, step: int, progress: Progress, reporter: Reporter, clock: RunClock) -> bool:
        """Evaluate now; record it; return whether the target was reached by it."""
        self.components.at("eval", step)
        elapsed = clock.elapsed()
        self.last = self.values()
        done = clock.elapsed()
        self.seconds += done - elapsed
        if self.last:
            reporter.evaluation(step, self.last)
        if self.target is None or progress.target_reached is not None:
            return False
        value = target_met(self.target, self.last)
        if value is None:
            return False
        # elapsed_s: when the evaluation that met it began; evaluated_s: when it ended.
        progress.target_reached = {"step": step, "elapsed_s": elapsed, "value": value,
                                   "evaluated_s": done}
        reporter.event(step, "target", f"target {self.config.train.target} reached at step "
                                       f"{step} after {elapsed:.1f} s")
        return True

    def guarded(self, step: int, progress: Progress, reporter: Reporter, clock: RunClock,
                checkpoints: CheckpointManager, save: Callable[[], None]) -> bool:
        """An evaluation whose failure loses no training: one that every rank agreed on
        (`EvaluationError`) commits this step first (`save`, unless it is committed); after
        the last step the run's last checkpoint is committed already."""
        try:
            return self.run(step, progress, reporter, clock)
        except EvaluationError as err:
            raise err.committed(step, _commit(checkpoints, step, save)) from err
        except Exception as err:
            try:
                saved = checkpoints.wait()
            except checkpoint.CheckpointError:
                saved = None
            if saved is not None or checkpoints.last_step == step:
                err.add_note(f"training reached step {step} and its checkpoint is "
                             f"committed ({checkpoints.root}); fix the evaluation and run "
                             "the same command again: it evaluates without training again")
            raise


def by_source(dataset: Any) -> list[str]:
    """What evaluating a mixture's data produces of each source (task/NAME/eval_loss and
    task/NAME/METRIC); nothing for another dataset."""
    if not isinstance(dataset, MixedDataset):
        return []
    return [task_metric(s.name, what) for s in dataset.mixture.sources
            for what in (task_kind(TASK_EVAL_LOSS), *s.metrics)]


def _seen_by(source: Source, metric: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """`metric` of one source, called on a batch of that source alone: on its head of the
    outputs and on its own collated samples."""
    def seen(outputs: Any, batch: Any) -> Any:
        return metric(Mixture.outputs_of(source, outputs, 0, batch_size(batch)),
                      batch.parts[source.name])
    return seen


def _commit(checkpoints: CheckpointManager, step: int, save: Callable[[], None]) -> str | None:
    """Commit the state at `step` (every rank); its path, or None if that failed."""
    try:
        if checkpoints.last_step != step:
            save()
        saved = checkpoints.wait()
    except checkpoint.CheckpointError as err:
        log.error("%s", err)
        return None
    return str(saved or checkpoints.root / f"step_{step:09d}")
