"""The run's components in order, and each hook called on those that override it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tandem.components.base import Component, RunParts, check_components, is_stateful


def _overriding(components: Sequence[Component], hook: str) -> list[Component]:
    base = getattr(Component, hook)
    return [c for c in components if getattr(type(c), hook, base) is not base]


class Chain:
    """Calls a hook on every component that defines it, in the run's order. The trainer
    talks to its components only through this."""

    def __init__(self, components: Sequence[Any]) -> None:
        self.components = check_components(components)
        # Per hook, only the components that override it: the loop calls the hot ones
        # (`at`, `loss`) on every micro-batch.
        self._at = _overriding(self.components, "at")
        self._loss = _overriding(self.components, "loss")
        self._before = _overriding(self.components, "before_step")
        self._after = _overriding(self.components, "after_step")

    @property
    def optional(self) -> list[str]:
        """States of add-on components: a checkpoint without them starts them afresh."""
        return [c.key for c in self.components if is_stateful(c) and
                type(c).fresh_start is not Component.fresh_start]

    @property
    def restores_frozen(self) -> bool:
        """Whether a component sets the frozen parameters at every start (checkpoints
        then leave them out: `ModelWeights`)."""
        return any(c.restores_frozen for c in self.components)

    def named(self, key: str) -> Component:
        """The component whose state is saved as `key`."""
        return next(c for c in self.components if c.key == key)

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Each component's change to the module, in order, before it is distributed."""
        for c in self.components:
            model = c.transform_model(model, device)
        return model

    def rebuilt(self, model: nn.Module) -> nn.Module:
        """A fresh build given the trained module's structure, in order."""
        for c in self.components:
            model = c.rebuilt(model)
        return model

    def setup(self, parts: RunParts) -> None:
        """Every component takes hold of the distributed run."""
        for c in self.components:
            c.setup(parts)

    def at(self, phase: str, step: int) -> None:
        """The loop reached `phase` of `step`."""
        for c in self._at:
            c.at(phase, step)

    def before_step(self, step: int) -> None:
        """Before optimizer step `step`."""
        for c in self._before:
            c.before_step(step)

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        """The loss after every component's change, in order."""
        for c in self._loss:
            loss = c.loss(loss, outputs, batch)
        return loss

    def after_step(self, step: int, skipped: bool) -> None:
        """After the optimizer step that made `step` steps done."""
        for c in self._after:
            c.after_step(step, skipped)

    def after_checkpoint(self, moment: str, step: int, path: Path) -> None:
        """A checkpoint was written or committed."""
        for c in self.components:
            c.after_checkpoint(moment, step, path)

    def metrics(self) -> dict[str, float]:
        """Every component's figures for the window."""
        out: dict[str, float] = {}
        for c in self.components:
            out.update(c.metrics())
        return out

    @property
    def swaps_weights(self) -> bool:
        """Whether a component changes the weights evaluation sees (`evaluating`)."""
        return bool(_overriding(self.components, "evaluating"))

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Every component's evaluation context, nested in order."""
        with contextlib.ExitStack() as stack:
            for c in self.components:
                stack.enter_context(c.evaluating())
            yield

    def close(self) -> None:
        """Every component, last first; one failing does not stop the others'."""
        errors: list[BaseException] = []
        for c in reversed(self.components):
            try:
                c.close()
            except Exception as err:  # noqa: BLE001 - closed all, then the first raised
                errors.append(err)
        if errors:
            raise errors[0]
