"""The trainer's own state, checkpointed as JSON beside the tensors.

Two objects, because a rollback treats them differently: `TrainState` goes back with
the weights (it says where in training the weights are), `Progress` never does (it says
what the run has done: data consumed, time spent, faults met). A rollback replaces the
first as a whole from the checkpoint and keeps the second as a whole; a new field must
be put in one of them, and so says which way it goes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from tandem.checkpoint import ModelWeights, OptimizerState
from tandem.components.base import Held, Stateful
from tandem.data.sampler import Cursor
from tandem.parallel.strategy import Strategy


@dataclass(kw_only=True)
class TrainState:
    """Where the weights are in training: restored by a rollback with them."""

    step: int = 0  # optimizer steps done

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace every field from `state_dict` output."""
        self.step = int(state["step"])


@dataclass(kw_only=True)
class Progress:
    """What the run has done, over all its attempts: never rolled back."""

    cursor: Cursor = field(default_factory=Cursor)  # the next sample of the global order
    samples: int = 0
    elapsed_s: float = 0.0  # wall time of the run over all attempts, at the last commit
    train_s: float = 0.0  # time in training steps only (no evaluation, no checkpoints)
    target_reached: dict[str, float] | None = None  # {"step", "elapsed_s", "value"}
    attempts: int = 1
    run_id: str = ""  # the run's id in the run store, kept across resumes
    rollbacks: int = 0
    lr_scale: float = 1.0  # product of fault.rollback_lr_scale over the rollbacks

    def consume(self, size: int, dataset_len: int) -> None:
        """A step of `size` samples was trained: move the cursor as the sampler did."""
        self.cursor.take(size, dataset_len)
        self.samples += size

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        state = {f.name: getattr(self, f.name) for f in fields(self)}
        state["cursor"] = self.cursor.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace every field from `state_dict` output."""
        fresh = Progress(
            cursor=Cursor.from_state(state["cursor"]),
            samples=int(state["samples"]),
            elapsed_s=float(state["elapsed_s"]),
            train_s=float(state["train_s"]),
            target_reached=state.get("target_reached"),
            attempts=int(state["attempts"]),
            run_id=str(state["run_id"]),
            rollbacks=int(state["rollbacks"]),
            lr_scale=float(state["lr_scale"]),
        )
        for f in fields(self):
            setattr(self, f.name, getattr(fresh, f.name))


STRATEGY = "strategy"  # the name of the strategy's state


def own_states(model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy,
               precision: Stateful, state: TrainState, progress: Progress,
               skip_frozen: bool = False) -> list[Held]:
    """The trainer's own states, listed like the components': all but the run's Progress
    go back with the weights in a rollback. The optimizer's state is keyed by the names
    the strategy gives its parameters (`Strategy.naming_module`). `skip_frozen`: the
    weights' state leaves out frozen parameters (`ModelWeights`). The optimizer's state
    is also handed to the strategy, which keeps each rank's own where replicas differ."""
    optim = OptimizerState(strategy.naming_module(), optimizer)
    strategy.keep_per_replica("optim", optim)
    return [Held("model", ModelWeights(model, skip_frozen), True),
            Held("optim", optim, True),
            Held(STRATEGY, strategy, True), Held("precision", precision, True),
            Held("train", state, True), Held("progress", progress, False)]
