"""The run component protocol: what a capability added to a run may hook into.

A component is an object with optional hooks that the trainer calls in the order the
run's components are listed, the same way for every plan:

- `transform_model(model, device)`: change the built module before it is distributed
  (freeze parameters, recompute activations, compile, insert adapters);
- `rebuilt(model)`: make the same change of structure on a fresh build of the module,
  for the trained model handed back at the end (its weights are then copied in);
- `setup(parts)`: take hold of the distributed model and the optimizer;
- `before_step(step)`, `loss(loss, outputs, batch)`, `after_step(step, skipped)`: around
  each optimizer step; `loss` sees every micro-batch's loss and returns the loss to train;
- `at(phase, step)`, `after_checkpoint(moment, step, path)`: where the loop is;
- `evaluating()`: a context the weights are evaluated and exported in (an average);
- `metrics()`: figures added to each logging window;
- `state_dict()` / `load_state_dict()` (DCP's `Stateful`): a component that defines them
  is saved in every checkpoint under its `name`, and restored by a rollback when
  `rolls_back` is true (state that says where the weights are) or kept when false (state
  that says what the run has done); `fresh_start()` is called instead when a checkpoint
  resumed from holds no state of it (the component was added at this resume);
- `close()`: release what it holds when the run ends.

The trainer's own state (weights, optimizer, strategy, precision, step, progress) is
listed the same way (`Held`), so the checkpoint's states and the rollback's set are both
derived from one list (`checkpoint_states`, `rollback_names`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tandem.checkpoint import Stateful


@dataclass(frozen=True)
class RunParts:
    """What a component may work with once the model is distributed."""

    model: nn.Module  # the distributed module (a wrapper, or the module itself)
    module: nn.Module  # the user's module inside any wrapper: its names are the checkpoint's
    optimizer: torch.optim.Optimizer
    device: torch.device
    # After parameter values are overwritten in place: drop any gathered copy (FSDP2).
    weights_replaced: Callable[[], None]


class Component:
    """A part of a run with optional hooks; every hook here does nothing.

    Subclass it and override the hooks the capability needs. `name` keys the component's
    state in checkpoints (default: the class name in lower case); it must be unique in a
    run and must not change between a save and a resume.
    """

    name: str = ""
    rolls_back: bool = True  # a rollback restores its state with the weights
    # It sets the frozen parameters at every start (run.init_from): checkpoints need not
    # hold them.
    restores_frozen: bool = False

    @property
    def key(self) -> str:
        """The name its state is saved under."""
        return self.name or type(self).__name__.lower()

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """The module to distribute instead of `model` (in place or a new one). Local."""
        return model

    def rebuilt(self, model: nn.Module) -> nn.Module:
        """`model`, a fresh build of the user's module, with the structure
        `transform_model` gave the trained one (adapters, for instance), so that the
        trained weights load into it. Only structure matters: its weights are replaced."""
        return model

    def setup(self, parts: RunParts) -> None:
        """Take hold of the distributed model and the optimizer, before any forward (FSDP2
        swaps the parameters a module registers while it runs one). All ranks."""

    def before_step(self, step: int) -> None:
        """Before optimizer step `step` (steps done so far) begins."""

    def loss(self, loss: torch.Tensor, outputs: Any, batch: Any) -> torch.Tensor:
        """The loss to train on one micro-batch, given the task's `loss` of it."""
        return loss

    def after_step(self, step: int, skipped: bool) -> None:
        """After the optimizer step that made `step` steps done; `skipped`: the update was
        skipped (non-finite gradients)."""

    def at(self, phase: str, step: int) -> None:
        """The loop reached `phase` ('step', 'data', 'compute', 'optim', 'eval', 'window',
        'checkpoint') of step `step`."""

    def after_checkpoint(self, moment: str, step: int, path: Path) -> None:
        """A checkpoint of `step` was 'written' (not yet committed) or 'committed'."""

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """The context evaluation and the exported model see the weights in."""
        return contextlib.nullcontext()

    def metrics(self) -> dict[str, float]:
        """Figures for the logging window that closes now."""
        return {}

    def fresh_start(self) -> None:
        """The checkpoint resumed from holds no state of this component: start afresh."""

    def close(self) -> None:
        """The run ends (also after a failure)."""


class Held(Component):
    """A state of the trainer's own, listed beside the components."""

    def __init__(self, name: str, state: Stateful, rolls_back: bool) -> None:
        self.name, self.state, self.rolls_back = name, state, rolls_back

    def state_dict(self) -> dict[str, Any]:
        """The held object's state."""
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the held object's state."""
        self.state.load_state_dict(state)

    def fresh_start(self) -> None:
        """The checkpoint holds no state for the held object: it starts afresh, if it can."""
        start = getattr(self.state, "fresh_start", None)
        if start is not None:
            start()


def is_stateful(component: Component) -> bool:
    """Whether the component has a state that checkpoints keep."""
    return callable(getattr(component, "state_dict", None)) and callable(
        getattr(component, "load_state_dict", None))


def checkpoint_states(components: Sequence[Component]) -> dict[str, Stateful]:
    """The states a checkpoint holds, by name, in the components' order."""
    return {c.key: c for c in components if is_stateful(c)}  # type: ignore[misc]


def rollback_names(components: Sequence[Component]) -> list[str]:
    """The states a rollback restores: those of components that go back with the weights."""
    return [c.key for c in components if is_stateful(c) and c.rolls_back]


def check_components(components: Sequence[Any]) -> list[Component]:
    """The run's components as a list; ValueError for a non-component or a repeated name."""
    out: list[Component] = []
    for item in components:
        if not isinstance(item, Component):
            raise ValueError(f"components: {item!r} is not a tandem.Component; subclass "
                             "tandem.Component and override the hooks it needs")
        out.append(item)
    names = [c.key for c in out if is_stateful(c)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"components: the state name(s) {repeated} are given twice; give "
                         "each stateful component its own `name`")
    return out
