"""Pipeline parallelism with torch.distributed.pipelining: stages on the `pp` axis of the
mesh, data-parallel replicas of each stage on the `dp` axis.

Every process builds the whole model, keeps the parameters of its own stages
(`stages.shell`: their names are the whole model's, so checkpoints reshard between a
pipeline and one process) and runs the schedule's actions for them. The step's
micro-batches are the trainer's: the schedule orders their forward and backward
passes (`forward_backward`), the task's loss runs on the last stage as it does in one
process (`Task.loss` and the components' terms, divided by the number of micro-batches),
and its value reaches every rank. After the last backward the stage gradients are
averaged over the replicas and tied parameters (an embedding shared with the head) are
summed over the stages that hold them; the gradient norm is taken over the whole model.
The rest of the model (which other stages train) is fetched from its stages only to run
the whole model: the preflight check, evaluation and the exported module.

With tensor parallelism (plan.tp > 1, a (pp, dp, tp) mesh) the task's named layers are
split over each stage's tensor-parallel peers before the model is cut into stages: a
stage's peers run it together, and hand the next stage's peers (the same tp index) the
replicated activations. A peer's stage gradients are its own shards (split layers) or
whole copies (the rest), so the gradient norm counts a copy on the first peer only.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_leaves

from tandem.monitor.catalogue import PP_BACKWARD_S, PP_BUBBLE, PP_BUBBLE_PREDICTED, PP_FORWARD_S
from tandem.parallel import bubble, schedules
from tandem.parallel.fsdp import gather
from tandem.parallel.registry import PP, StrategyInfo
from tandem.parallel.stages import auto_split, parse_split, shell
from tandem.parallel.strategy import (
    Backward,
    Build,
    LossOf,
    MicroBatches,
    Pass,
    Strategy,
    fresh_copy,
    plain_backward,
)
from tandem.parallel.tensor import local, mixed_ops, split_layers, tp_sharded

log = logging.getLogger("tandem")


class _Captured(Exception):  # noqa: N818 - control flow, not an error
    """The model's call arguments, taken from the task's forward."""

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__("captured")
        self.args, self.kwargs = args, kwargs


class _Part(nn.Module):
    """One stage's shell, run under the autocast the step's forward asked for."""

    def __init__(self, part: nn.Module, owner: PipelineStrategy) -> None:
        super().__init__()
        self.part, self.owner = part, [owner]  # a list: not a sub-module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        dtype = self.owner[0].autocast
        device = self.owner[0].runtime.device.type
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            return type(self.part).forward(self.part, *args, **kwargs)


class PipelineStrategy(Strategy):
    """Pipeline stages over the `pp` ranks; each stage replicated over the `dp` ranks."""

    info: ClassVar[StrategyInfo] = PP
    times_comm: ClassVar[bool] = False
    whole_step_passes: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plan, layout = self.plan, self.layout
        self.pp, self.pp_rank = layout.size("pp"), layout.index("pp")
        self.stage_count = self.pp * plan.pp_virtual
        self.mine = schedules.stage_indices(plan.pp_schedule, self.pp, plan.pp_virtual,
                                            self.pp_rank)
        self.owner_of = {s: r for r in range(self.pp) for s in schedules.stage_indices(
            plan.pp_schedule, self.pp, plan.pp_virtual, r)}
        self.watchdog = schedules.Watchdog(plan.pp_schedule, plan.pp_watchdog_s)
        self.full: nn.Module | None = None  # the whole model (others' parts fetched on use)
        self.parts: list[nn.Module] = []
        self.split: list[list[str]] = []
        self.schedule: Any = None
        self.micro = 0  # micro-batches the schedule was built for
        self.inferring = False  # the next loss is the new schedule's shape inference
        self.shapes: tuple = ()  # and the shapes of their inputs
        self.autocast: torch.dtype | None = None
        self.mode = ""  # "capture" (the model's arguments) or "feed" (the last stage's output)
        self.fed: Any = None
        self.losses: list[torch.Tensor] = []
        self.loss_of: LossOf | None = None
        self.batches: list[Any] = []  # the step's micro-batches
        self.stale = False  # the other stages' weights in `full` are older than theirs
        # Per window: compute actions (F, B, W), waits on sends and receives (P), the
        # schedule's own span and the step's (to the drain's end).
        self.times = {"F": 0.0, "B": 0.0, "W": 0.0, "P": 0.0, "schedule": 0.0, "step": 0.0,
                      "steps": 0.0}
        self.phases = {"forward": 0.0, "backward": 0.0}  # for the step's phase clock

    # ------------------------------------------------------------ building
    def _split(self, model: nn.Module, tensor_plan: Mapping[str, str] | None) -> nn.Module:
        """With plan.tp > 1, split the task's named layers over the tensor-parallel peers
        (the stages are cut from the split model)."""
        return model if self.layout.tp_size == 1 else split_layers(model, tensor_plan,
                                                                    self.layout)

    @property
    def pp_group(self) -> dist.ProcessGroup:
        """The pipeline's ranks (one per pp index, this rank's dp index)."""
        group = self.layout.pp_group
        assert group is not None
        return group

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan = self.plan
        self.split = (parse_split(plan.pp_split, model, self.stage_count) if plan.pp_split
                      else auto_split(model, self.stage_count))
        self.full = model
        local = shell(model, [u for s in self.mine for u in self.split[s]])
        local.forward = self._dispatch  # type: ignore[method-assign]
        self.parts = [shell(model, self.split[s]) for s in self.mine]
        self.stage_modules = [_Part(part, self) for part in self.parts]
        self.aliases = _aliases(model)
        log.info("pipeline: %d stages (%s), this rank runs %s: %s", self.stage_count,
                 plan.pp_schedule, self.mine, " | ".join(",".join(self.split[s])
                                                         for s in self.mine))
        return local

    def naming_module(self) -> nn.Module:
        """The whole model: a tied parameter is then named as one process names it (the
        last stage's head weight is the embedding's), so optimizer state moves between
        layouts."""
        assert self.full is not None, "wrap() first"
        return self.full

    def _build_schedule(self, micro: int) -> None:
        from torch.distributed.pipelining import PipelineStage

        name = self.plan.pp_schedule
        schedules.check(name, self.pp, self.plan.pp_virtual, micro)
        stages = [PipelineStage(module, s, self.stage_count, self.runtime.device,
                                group=self.pp_group)
                  for s, module in zip(self.mine, self.stage_modules, strict=True)]
        for stage in stages:
            label = stage.stage_index
            for attr, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                               ("backward_weight_one_chunk", "W")):
                setattr(stage, attr, schedules.timed(
                    getattr(stage, attr), self.watchdog,
                    lambda k, kind=kind, label=label: f"stage {label}, action {kind} of "
                                                     f"micro-batch {k}",
                    lambda dt, kind=kind: self._add(kind, dt)))
        cls = schedules.schedule_class(name)
        kwargs = {"n_microbatches": micro, "loss_fn": self._loss, "scale_grads": False}
        multi = schedules.SCHEDULES[name].multi
        self.schedule = cls(stages, **kwargs) if multi else cls(stages[0], **kwargs)
        self.stages, self.micro = stages, micro
        self.inferring = self.stage_count - 1 in self.mine

    def _waited(self, seconds: float) -> None:
        self.times["P"] += seconds

    def _add(self, kind: str, seconds: float) -> None:
        self.times[kind] += seconds
        self.phases["forward" if kind == "F" else "backward"] += seconds

    @contextmanager
    def calibrating(self, one_pass: Pass) -> Iterator[None]:
        """The calibration's passes are not the window's: their stage times are dropped."""
        times, phases = dict(self.times), dict(self.phases)
        try:
            yield
        finally:
            self.times, self.phases = times, phases

    def take_phase_seconds(self) -> dict[str, float]:
        """The stages' forward and backward (input and weight) seconds since the last call."""
        taken, self.phases = self.phases, {"forward": 0.0, "backward": 0.0}
        return taken

    # ------------------------------------------------------------ each step
    def _dispatch(self, *args: Any, **kwargs: Any) -> Any:
        """The local module's forward: hands the schedule what it needs from the task's
        forward and loss; outside a schedule step, runs the whole model."""
        if self.mode == "capture":
            device = self.runtime.device.type
            self.autocast = (torch.get_autocast_dtype(device)
                             if torch.is_autocast_enabled(device) else None)
            raise _Captured(args, kwargs)
        if self.mode == "feed":
            return self.fed
        self._refresh()
        assert self.full is not None
        return self.full(*args, **kwargs)

    def _capture(self, loss_of: LossOf, batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        self.mode = "capture"
        try:
            loss_of(batch)
        except _Captured as got:
            return got.args, got.kwargs
        finally:
            self.mode = ""
        raise RuntimeError("plan.pp: the task's forward did not call the model")

    def _loss(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        """The schedule's loss on the last stage: the task's loss of the stage's output on
        micro-batch `index` (the schedule takes tensors as targets, not batches)."""
        assert self.loss_of is not None
        if self.inferring:
            # A new schedule's first step infers the gradients' shapes from a loss of the
            # last stage's output: any scalar of it will do. The task's loss runs once per
            # micro-batch trained, as in one process (a loss that counts what it saw).
            self.inferring = False
            return sum((t.sum() for t in tree_leaves(output) if isinstance(t, torch.Tensor)
                        and t.is_floating_point()),
                       torch.zeros((), device=self.runtime.device)) * 0.0
        self.mode, self.fed = "feed", output
        started = time.perf_counter()
        try:
            loss = self.loss_of(self.batches[int(index)])
        finally:
            self.mode, self.fed = "", None
        # The loss is the last stage's forward work, not idle time (the step's own phase
        # clock counts it as forward already, through `loss_of`).
        self.times["F"] += time.perf_counter() - started
        self.losses.append(loss.detach().float())
        return loss / self.micro

    def forward_backward(self, micro_batches: MicroBatches, loss_of: LossOf,
                         backward: Backward = plain_backward, probe: bool = False,
                         sync: bool = True) -> torch.Tensor:
        """The schedule's forward and backward passes over the step's micro-batches; the
        sum of their losses (from the last stage, on every rank). All ranks."""
        batches = list(micro_batches)
        inputs = [self._capture(loss_of, b) for b in batches]
        # The stages learn their activations' shapes at a schedule's first step: a new
        # count or new input shapes (a sequence-length ramp) need a new schedule.
        shapes = _shapes(inputs)
        if self.schedule is None or len(batches) != self.micro or shapes != self.shapes:
            self._build_schedule(len(batches))
            self.shapes = shapes
        self.loss_of, self.losses, self.batches = loss_of, [], batches
        first, last = 0 in self.mine, self.stage_count - 1 in self.mine
        started = time.perf_counter()
        with self.watchdog.step(), schedules.timed_waits(self._waited):
            for stage in self.stages:
                stage.has_backward = True
                stage.clear_runtime_states()
            self.schedule._step_microbatches(
                [a for a, _ in inputs] if first else [()] * self.micro,
                [k for _, k in inputs] if first else [{}] * self.micro,
                [torch.tensor(k) for k in range(self.micro)] if last else None, None,
                return_outputs=False)
        self.times["schedule"] += time.perf_counter() - started
        total = (torch.stack(self.losses).sum() if last
                 else torch.zeros((), device=self.runtime.device))
        # The all-reduce ends when the last stage's last action has: a rank that finished
        # its own actions waits there for the drain, which is part of its bubble.
        dist.all_reduce(total, group=self.pp_group)
        self.times["step"] += time.perf_counter() - started
        self.times["steps"] += 1
        self.stale = True
        return total

    def after_backward(self) -> None:
        """Average the stage gradients over the replicas; sum tied parameters' gradients
        over the stages that hold them."""
        assert self.model is not None
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self._average_replicas(params)
        held = {id(p): p for p in params}
        for fqns, param in self.aliases:
            owners = {self._owner(f) for f in fqns}
            if len(owners) < 2:
                continue
            mine = held.get(id(param))
            grad = (self._local(mine.grad) if mine is not None and mine.grad is not None
                    else self._no_grad(param))
            dist.all_reduce(grad, group=self.pp_group)

    def _average_replicas(self, params: list[nn.Parameter]) -> None:
        """Average the stage gradients over the data-parallel replicas (one flat
        all-reduce)."""
        if self.layout.dp_size == 1 or not params:
            return
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        grads = [local(p.grad) for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.layout.dp_group)
        flat /= self.layout.dp_size
        for g, v in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(v)

    @staticmethod
    def _local(tensor: torch.Tensor) -> torch.Tensor:
        """The part of `tensor` this rank holds (its tensor-parallel or FSDP2 shard)."""
        return local(tensor)

    def _no_grad(self, param: nn.Parameter) -> torch.Tensor:
        """Zeros in place of this rank's part of the gradient of a parameter it does not
        train (a tied weight whose stages are elsewhere)."""
        return torch.zeros_like(param)

    def _first_copy(self) -> bool:
        """Whether this rank's stage gradients count in the norm: the first replica's
        (the replicas hold equal ones after averaging)."""
        return self.layout.dp_rank == 0

    def grad_norm(self, params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
        """The whole model's gradient norm (each tied parameter counted once); clip."""
        counted = [p for p in params if p.grad is not None and self._counts(p)]
        sq = sum((self._local(p.grad.detach()).float().pow(2).sum() for p in counted),
                 torch.zeros((), device=self.runtime.device))
        dist.all_reduce(sq)  # every rank: its counted parts make the whole model's once
        norm = sq.sqrt()
        if max_norm > 0:
            coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            for p in params:
                if p.grad is not None:
                    self._local(p.grad.detach()).mul_(coef.to(p.grad.dtype))
        return norm

    def _counts(self, param: torch.nn.Parameter) -> bool:
        """Whether this rank counts `param`'s gradient in the norm: the first copy over
        the replicas, the tensor-parallel peers (unless split over them) and the stages
        holding a tied weight."""
        if not self._first_copy() or (self.layout.tp_rank and not tp_sharded(param)):
            return False
        for fqns, p in self.aliases:
            if p is param:
                return min(self._owner(f) for f in fqns) == self.pp_rank
        return True

    def _owner(self, fqn: str) -> int:
        """The pp rank whose stages hold parameter or buffer `fqn`."""
        for stage, units in enumerate(self.split):
            if any(fqn == u or fqn.startswith(u + ".") for u in units):
                return self.owner_of[stage]
        raise AssertionError(f"{fqn} is in no stage")

    def after_step(self, step: int, last: bool) -> None:
        """The other stages' weights changed."""
        self.stale = True

    def weights_replaced(self) -> None:
        """An average was swapped in or out: fetch the other stages' weights again."""
        self.stale = True

    def _refresh(self) -> None:
        """Copy every stage's weights into the whole model, from the rank holding them."""
        if not self.stale:
            return
        assert self.full is not None
        group = self.pp_group
        for fqn, tensor in [*self.full.named_parameters(), *self.full.named_buffers()]:
            owner = self._owner(fqn)
            if owner == self.pp_rank:
                self._fill(fqn, tensor)
            # Under plan.tp a peer's own shard: its peers of the other stages share its index.
            dist.broadcast(local(tensor.data), src=dist.get_global_rank(group, owner),
                           group=group)
        self.stale = False

    def _fill(self, fqn: str, tensor: torch.Tensor) -> None:
        """Copy this rank's trained value of `fqn` into the whole model's `tensor` (it is
        that value already: the stages share the whole model's parameters)."""

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float | list[float]]:
        """Per step, for every rank: its stages' forward and backward seconds, their idle
        share measured, and the idle share the schedule's action table predicts from every
        stage's measured costs (`bubble`). Two all_gathers (the pipeline's ranks, then
        all ranks). All ranks."""
        t, n = self.times, max(self.times["steps"], 1.0)
        self.times = dict.fromkeys(self.times, 0.0)
        if not (self.micro and t["steps"]):  # the same on every rank: they step together
            return {}
        # The schedule's own time: neither an action nor a wait (posting sends and
        # receives, its bookkeeping), spread over the rank's actions in the prediction.
        own = max(0.0, t["schedule"] - t["F"] - t["B"] - t["W"] - t["P"]) / n
        mine = [t["F"] / n, t["B"] / n, t["W"] / n, t["step"] / n, own]
        rows = self._gather(mine, self.pp_group)
        seconds = [dict(zip("FBW", row[:3], strict=True)) for row in rows]
        order = bubble.action_order(self.plan.pp_schedule, self.pp, self.plan.pp_virtual,
                                    self.micro)
        predicted = bubble.predicted_idle(order, bubble.per_action_costs(order, seconds),
                                          [row[4] / max(len(o), 1)
                                           for row, o in zip(rows, order, strict=True)])
        # The step's span, as the prediction's: from the first stage's start (the rank
        # that entered the step first) to the drain's end (every rank's clock stops after
        # the same all-reduce).
        span = max(row[3] for row in rows)
        measured = max(0.0, 1.0 - sum(mine[:3]) / span) if span > 0 else 0.0
        every = self._gather([mine[0], mine[1] + mine[2], measured, predicted[self.pp_rank]])
        return {name: [row[i] for row in every] for i, name in enumerate(
            (PP_FORWARD_S, PP_BACKWARD_S, PP_BUBBLE, PP_BUBBLE_PREDICTED))}

    def _gather(self, values: list[float], group: dist.ProcessGroup | None = None,
                ) -> list[list[float]]:
        """Every rank's `values` (of `group`, default all ranks), in rank order."""
        mine = torch.tensor(values, dtype=torch.float64, device=self.runtime.device)
        size = dist.get_world_size(group)
        every = [torch.zeros_like(mine) for _ in range(size)]
        dist.all_gather(every, mine, group=group)
        return [row.tolist() for row in every]

    def export_model(self, build: Build) -> nn.Module:
        """The whole model with every stage's weights, in a fresh plain module."""
        self._refresh()
        assert self.full is not None
        if self.layout.tp_size > 1:  # the split layers' shards gathered
            return gather(self.full, build().to(self.runtime.device))
        return fresh_copy(build, self.full, self.runtime.device)

    def optimizer_context(self) -> contextlib.AbstractContextManager[None]:
        """Under plan.tp, split (DTensor) and whole parameters meet in one optimizer."""
        return mixed_ops() if self.layout.tp_size > 1 else super().optimizer_context()

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        return {"strategy": self.name, "pp": self.pp, "tp": self.layout.tp_size,
                "pp_schedule": self.plan.pp_schedule,
                "pp_virtual": self.plan.pp_virtual, "pp_stages": self.mine,
                "pp_split": [",".join(s) for s in self.split]}


def _aliases(model: nn.Module) -> list[tuple[list[str], nn.Parameter]]:
    """Parameters reachable under several names (tied weights): (names, parameter)."""
    names: dict[int, list[str]] = {}
    params: dict[int, nn.Parameter] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(fqn)
        params[id(p)] = p
    return [(fqns, params[i]) for i, fqns in names.items() if len(fqns) > 1]


def _shapes(inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> tuple:
    """The shapes and dtypes of every tensor the micro-batches hand the first stage."""
    def of(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (tuple(value.shape), value.dtype)
        if isinstance(value, (list, tuple)):
            return tuple(of(v) for v in value)
        if isinstance(value, dict):
            return tuple((k, of(v)) for k, v in sorted(value.items()))
        return None
    return tuple(of(item) for item in inputs)
