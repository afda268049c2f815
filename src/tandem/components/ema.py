"""An exponential moving average of the weights: what evaluation, checkpoints and the
returned model see when `train.ema_decay` is set.

The average is kept beside each trainable parameter in the parameter's own form: a plain
tensor under DDP (every rank holds the same replica, so every rank's average is the
same), a DTensor shard under FSDP2 or tensor parallelism (each rank averages its own
shard; no communication). It is a run component (`EMA`) with a state of its own ("ema"
in the checkpoint, keyed by the unwrapped parameter names), so DCP reshards it like the
weights, and a rollback takes it back with them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from tandem.components.base import Component, RunParts

WARMUP = 10  # the decay at update t is min(decay, (1 + t) / (WARMUP + t))


def decay_at(decay: float, updates: int) -> float:
    """The decay of update number `updates` (0-based): early updates weigh the weights
    more, so the average does not remember the initial weights for ~1 / (1 - decay)
    steps."""
    return min(decay, (1 + updates) / (WARMUP + updates))


class WeightAverage:
    """ema <- d * ema + (1 - d) * w after every optimizer step that updated the weights."""

    def __init__(self, module: nn.Module, decay: float) -> None:
        # `module` is the user's module inside any wrapper: its names are the checkpoint's.
        self.decay = decay
        self.params = {name: p for name, p in module.named_parameters() if p.requires_grad}
        with torch.no_grad():
            self.average = {name: p.detach().clone() for name, p in self.params.items()}
        self.updates = 0

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights (after an optimizer step)."""
        weight = 1.0 - decay_at(self.decay, self.updates)
        averages = list(self.average.values())
        current = [p.detach() for p in self.params.values()]
        if all(type(a) is torch.Tensor for a in averages):
            torch._foreach_lerp_(averages, current, weight)
        else:  # DTensor shards: lerp each on its own (foreach over DTensors is not universal)
            for average, value in zip(averages, current, strict=True):
                average.lerp_(value, weight)
        self.updates += 1

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average again from the current weights (a checkpoint without one)."""
        for name, p in self.params.items():
            self.average[name].copy_(p.detach())
        self.updates = 0

    @contextlib.contextmanager
    def swapped(self, settle: Callable[[], None] | None = None) -> Iterator[None]:
        """Inside: the parameters hold the average; after: their own values again.

        `settle` runs after each exchange (the strategy's `weights_replaced`: FSDP2 must
        drop parameters it gathered before, or its next forward would use them).
        """
        with torch.no_grad():
            kept = {name: p.detach().clone() for name, p in self.params.items()}
            for name, p in self.params.items():
                p.detach().copy_(self.average[name])
        if settle is not None:
            settle()
        try:
            yield
        finally:
            with torch.no_grad():
                for name, p in self.params.items():
                    p.detach().copy_(kept[name])
            if settle is not None:
                settle()

    def state_dict(self) -> dict[str, Any]:
        """The averages by parameter name and the number of updates."""
        return {"weights": dict(self.average), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy loaded averages in (DCP may have loaded them in place already)."""
        with torch.no_grad():
            for name, value in state["weights"].items():
                if value is not self.average[name]:
                    self.average[name].copy_(value)
        self.updates = int(state["updates"])


@contextlib.contextmanager
def averaged(average: WeightAverage | None,
             settle: Callable[[], None] | None = None) -> Iterator[None]:
    """Inside: the model holds the average of its weights, if the run keeps one."""
    if average is None:
        yield
        return
    with average.swapped(settle):
        yield


class EMA(Component):
    """`train.ema_decay` as a run component: the average follows every applied update and
    is what evaluation and the exported model see."""

    name = "ema"

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.average: WeightAverage | None = None
        self.settle: Callable[[], None] | None = None

    def setup(self, parts: RunParts) -> None:
        """Start the average at the distributed module's weights."""
        self.average = WeightAverage(parts.module, self.decay)
        self.settle = parts.weights_replaced

    def after_step(self, step: int, skipped: bool) -> None:
        """Follow the update, unless it was skipped."""
        if self.average is not None and not skipped:
            self.average.update()

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """The parameters hold the average inside."""
        return averaged(self.average, self.settle)

    def fresh_start(self) -> None:
        """Averaging switched on at this resume: start from the resumed weights."""
        if self.average is not None:
            self.average.reset()

    def state_dict(self) -> dict[str, Any]:
        """The average's state."""
        assert self.average is not None, "setup() first"
        return self.average.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the average."""
        assert self.average is not None, "setup() first"
        self.average.load_state_dict(state)
