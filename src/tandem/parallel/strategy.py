"""The Strategy protocol: how one plan spreads the model, and what it does around a step.

A Strategy is built once from the plan (`build_strategy`) and owns everything the
trainer would otherwise branch on: how the model is built and wrapped (`wrap`), the
step's forward and backward passes over its micro-batches (`forward_backward`, which a
pipeline schedule overrides; the default skips synchronisation on all but the last
micro-batch with `no_sync`), what runs after the last backward and after the optimizer
step, what it sent (`window_figures`), its own state in checkpoints, and the plain
module handed back at the end (`export_model`). The trainer calls these hooks in the
same order for every plan and never asks for a name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any, ClassVar, Protocol

import torch
from torch import nn

from tandem.clocks import Mark
from tandem.config import PlanConfig
from tandem.parallel import deferred
from tandem.parallel.checks import check_model
from tandem.parallel.host_allreduce import SharedMemoryGroup
from tandem.parallel.mesh import Layout
from tandem.parallel.registry import SINGLE, StrategyInfo
from tandem.runtime import Runtime

Build = Callable[[], nn.Module]
Pass = Callable[[bool], None]  # one forward+backward, synchronising gradients or not
LossOf = Callable[[Any], torch.Tensor]  # a micro-batch's loss, forward included
Backward = Callable[[torch.Tensor], None]  # backward of a loss (a scaler's, under fp16)


class MicroBatches(Sized, Iterable[Any], Protocol):
    """The step's micro-batches: their number is known before the first is drawn."""


def plain_backward(loss: torch.Tensor) -> None:
    """`loss.backward()`."""
    loss.backward()


class Strategy:
    """No parallelism: one process holds and updates the whole model.

    Subclasses override the hooks their plan needs; every hook here is what a single
    process does (nothing). All hooks must be called on all processes.
    """

    info: ClassVar[StrategyInfo] = SINGLE
    name: ClassVar[str] = SINGLE.name  # a subclass's is its `info`'s (`__init_subclass__`)
    shards_weights: ClassVar[bool] = False  # each rank holds only a part of the weights
    # Deferred init: whether `_wrap` needs real values (DDP broadcasts them) or can take
    # meta parameters and have them materialised afterwards, shard by shard (FSDP, TP).
    wraps_meta: ClassVar[bool] = False
    # The trainer can time this plan's communication on the step's critical path (DDP's
    # wait in backward, a separate all-reduce or meeting); FSDP's is not seen.
    times_comm: ClassVar[bool] = True
    # Every rank holds the same weights and gradients at every step (DDP): an optimizer
    # may split per-parameter work over the ranks and share the results.
    identical_replicas: ClassVar[bool] = False
    # One forward/backward pass takes a whole step's micro-batches (a pipeline schedule
    # runs them together): calibration measures a pass of the step's count, not of one.
    whole_step_passes: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.info.name

    def __init__(self, plan: PlanConfig, runtime: Runtime, layout: Layout, seed: int) -> None:
        self.plan, self.runtime, self.layout, self.seed = plan, runtime, layout, seed
        self.model: nn.Module | None = None  # the wrapped module, once `wrap` ran

    # ------------------------------------------------------------ building
    def wrap(self, build: Build, tensor_plan: Mapping[str, str] | None = None) -> nn.Module:
        """Build the user's module with `build`, place it, apply the plan, wrap it."""
        return self.distribute(self.build(build), tensor_plan)

    def build(self, build: Build) -> nn.Module:
        """Run the model factory (on the meta device under deferred init) and check what
        it made. Local: no collective, so every process can agree on its outcome."""
        late = self.plan.init == "deferred"
        model = check_model(deferred.build_on_meta(build) if late else build())
        if late:
            deferred.check_initialisable(model)
        return model if late else model.to(self.runtime.device)

    def distribute(self, model: nn.Module,
                   tensor_plan: Mapping[str, str] | None = None) -> nn.Module:
        """Apply the plan to a built module and wrap it. All processes (collectives)."""
        device, late = self.runtime.device, self.plan.init == "deferred"
        model = self._prepare(model, tensor_plan)
        if late and not self.wraps_meta:
            deferred.materialise(model, device, self.seed)
        model = self._wrap(model)
        if late and self.wraps_meta:
            deferred.materialise(model, device, self.seed)
        self.model = model
        return model

    def _prepare(self, model: nn.Module, tensor_plan: Mapping[str, str] | None) -> nn.Module:
        """Split as the plan says, before any wrapper (the run's components changed the
        module before: recomputation, compilation, frozen parameters)."""
        return self._split(model, tensor_plan)

    def _split(self, model: nn.Module, tensor_plan: Mapping[str, str] | None) -> nn.Module:
        """Tensor-parallel layouts split layers here; others leave the module as it is."""
        return model

    def _wrap(self, model: nn.Module) -> nn.Module:
        """The data-parallel wrapper of this plan (none here)."""
        return model

    @property
    def module(self) -> nn.Module:
        """The user's module inside any wrapper (an FSDP2 module is its own module)."""
        assert self.model is not None, "wrap() first"
        return self.model

    def naming_module(self) -> nn.Module:
        """The module whose names key the optimizer's state in checkpoints (the wrapped
        module: its names are the user's module's)."""
        assert self.model is not None, "wrap() first"
        return self.model

    # ------------------------------------------------------------ each step
    def forward_backward(self, micro_batches: MicroBatches, loss_of: LossOf,
                         backward: Backward = plain_backward, probe: bool = False,
                         sync: bool = True) -> torch.Tensor:
        """Forward and backward over the step's micro-batches, accumulating gradients;
        return the sum of their losses (detached, fp32).

        Each backward is of the loss / the number of micro-batches: with the mean over
        ranks after it, the gradient of the mean loss over the whole global batch. Every
        micro-batch but the last runs in `no_sync`; the last synchronises (unless `sync`
        is false: a pass timed without communication) with the gradient probe armed when
        `probe`. A pipeline schedule, which orders the passes itself, overrides this.
        All ranks.
        """
        count = len(micro_batches)
        total = torch.zeros((), device=self.runtime.device)
        for k, batch in enumerate(micro_batches):
            last = k == count - 1
            with contextlib.nullcontext() if last and sync else self.no_sync():
                loss = loss_of(batch)
                if probe and last:
                    self.arm_gradient_probe()
                backward(loss / count)
            total += loss.detach().float()
        return total

    @staticmethod
    def grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """The global norm of the (complete) gradients of `params`; clip them to
        `max_norm` when it is > 0."""
        if max_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        # FSDP2: the norm of sharded (DTensor) gradients is a replicated DTensor.
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """A context for accumulation micro-batches that skips gradient synchronisation."""
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        """After the step's last backward: gradients not reduced inside backward are."""

    def optimizer_context(self) -> contextlib.AbstractContextManager[None]:
        """The context clipping and the optimizer step run in."""
        return contextlib.nullcontext()

    def after_step(self, step: int, last: bool) -> None:
        """After the optimizer step `step` (steps done so far); `last`: the run's last."""

    def shared_memory(self) -> SharedMemoryGroup | None:
        """The shared-memory group the gradients go through instead of the process group
        (None: the process group's collectives); the link calibration times the same path,
        and an optimizer that shares work over the replicas (Muon) gathers through it."""
        return None

    def take_comm_mark(self) -> Mark | None:
        """When the last synchronising backward's last gradient was ready to communicate
        (None: this plan communicates nothing inside backward)."""
        return None

    def arm_gradient_probe(self) -> None:
        """Measure this rank's own gradient norm in the next synchronising backward, before
        any communication (the gradient noise scale's small-batch gradient). Plans that
        cannot see it do nothing."""

    def take_phase_seconds(self) -> dict[str, float]:
        """Seconds of the step's phases ("forward", "backward") this plan timed itself
        since the last call: a pipeline schedule runs them inside one call."""
        return {}

    def take_local_grad_sq(self) -> torch.Tensor | None:
        """|g_local|^2 the armed probe measured (None: not measured), and disarm."""
        return None

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float | list[float]]:
        """What the plan sent (and waited for) over the window's `steps` optimizer steps
        of `micro_batches` forward/backward passes in all; counters restart after. A value
        is the job's, or a list of one per rank (the job's is then their mean)."""
        return {}

    def weights_replaced(self) -> None:
        """The parameters' values were overwritten in place (an average swapped in or out):
        drop any gathered copy of them, so the next forward sees the new values."""

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the module holds the weights an evaluation is of (the
        model the workers share, where each trains its own replica)."""
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def calibrating(self, one_pass: Pass) -> Iterator[None]:
        """Extra forward/backward passes inside leave no trace in later steps."""
        yield

    # ------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The plan's own training state for checkpoints (tensors and JSON values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""

    def expect_saved_world(self, world: int) -> None:
        """A checkpoint of this plan written by `world` processes is about to be loaded
        (a plan that `resizes` lists every one of its replicas in `state_dict` then)."""

    def fresh_start(self) -> None:
        """The run resumed from a checkpoint of another plan, without this plan's state:
        start it from the weights loaded."""

    def keep_per_replica(self, name: str, state: Any) -> None:
        """A state that replicas hold differently between meetings (the optimizer's
        moments, a `Stateful`): a plan whose checkpoints hold every replica keeps each
        rank's own in its state (and restores it after the run's own section); others
        ignore it."""

    def export_model(self, build: Build) -> nn.Module | None:
        """The trained weights in a plain module that no process group owns.

        A DDP module's parameters carry the reducer's hooks (which hold the group) and
        FSDP2 / tensor-parallel parameters are DTensors of it: either, outliving the group,
        can abort the process at exit. Must be called on all processes.
        """
        return self.module

    def describe(self) -> dict[str, Any]:
        """Plan entries for the run record."""
        return {"strategy": self.name}


def fresh_copy(build: Build, model: nn.Module, device: torch.device) -> nn.Module:
    """A new plain module from `build` holding `model`'s (plain, full) weights."""
    fresh = build().to(device)
    fresh.load_state_dict(model.state_dict())
    return fresh
