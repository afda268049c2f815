"""Streaming DiLoCo: DiLoCo's meeting cut into fragments, staggered in time and overlapped
with the inner steps (Douillard et al., 2025, "Streaming DiLoCo with overlapping
communication").

The model's values (its parameters in module order, then its floating buffers, end to end)
are cut into P = `plan.fragments` contiguous fragments of equal size (a fragment may end
inside a tensor: one large matrix does not hold the peak up). Fragment p meets every
H = `plan.sync_every` steps, at the steps where (step - p * H // P) % H == 0, so at most
one fragment starts on the wire at any step: the peak traffic is about 1/P of DiLoCo's.
At its meeting a rank's pseudo-gradient (the fragment's outer parameters minus its own
replica's) starts summing over the ranks in the background (`async_op`, on a process
group of its own, in `plan.outer_dtype`); tau = `plan.overlap_steps` inner steps later the
sum is waited for and merged: DiLoCo's outer Nesterov step on that fragment's outer
parameters, then the replica's fragment takes the new outer values:

    local <- alpha * local + (1 - alpha) * outer    when tau > 0 (alpha: plan.merge_alpha)
    local <- outer                                  when tau = 0 (DiLoCo's replace)

With tau > 0 the replica moved on during the tau overlapped steps; mixing (the paper's
merge, alpha 0.5 by default) keeps part of that progress instead of throwing it away,
and alpha 0 replaces. With tau = 0 there is nothing to keep, so the merge replaces: P = 1,
tau = 0 is DiLoCo. After the run's last step every fragment in flight is merged and every
fragment not replaced at that step meets once more, blocking, and replaces, so all ranks
end with the same model (DiLoCo forces a last meeting too).

Checkpoints hold the outer parameters and momentum, every rank's own replica and
optimizer state (under its rank's keys: replicas differ between meetings; the run's own
model and optimizer sections hold, tensor by tensor, any one rank's) and every fragment in
flight: its sum is waited for at the save and merged at its own step after a resume, so a
resumed run is the uninterrupted one. A resume needs the world size the checkpoint was
written with.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from tandem.monitor.catalogue import (
    COMM_BYTES_PER_STEP,
    COMM_BYTES_PER_SYNC,
    COMM_MERGE_WAIT,
    COMM_OVERLAP,
    COMM_PEAK_BYTES_PER_SYNC,
)
from tandem.parallel.flat_state import assign, cloned, flat, overlay
from tandem.parallel.outer_sum import Sum, start_sum
from tandem.parallel.registry import STREAMING_DILOCO, StrategyInfo
from tandem.parallel.strategy import Strategy


def slices(sizes: list[int], parts: int) -> list[list[tuple[int, int, int]]]:
    """Cut the concatenation of tensors of `sizes` elements into `parts` contiguous runs of
    equal length (within one element); each run as its pieces (tensor index, start, stop)."""
    total = sum(sizes)
    if not 1 <= parts <= total:
        raise ValueError(f"plan.fragments: {parts} must be between 1 and the model's "
                         f"number of values ({total})")
    bounds = [k * total // parts for k in range(parts + 1)]
    offsets = [0, *itertools.accumulate(sizes)]
    runs = []
    for lo, hi in itertools.pairwise(bounds):
        runs.append([(i, max(a, lo) - a, min(b, hi) - a)
                     for i, (a, b) in enumerate(itertools.pairwise(offsets))
                     if max(a, lo) < min(b, hi)])
    return runs


@dataclass
class Fragment:
    """A contiguous run of the model's values with its outer state."""

    tensors: list[torch.Tensor]  # flat views of the model's tensors
    offset: int  # meets at the steps where (step - offset) % H == 0
    outer: torch.Tensor  # the shared (outer) parameters, flat fp32
    velocity: torch.Tensor  # the outer Nesterov momentum
    inbox: torch.Tensor  # the pseudo-gradient being summed, then its sum
    sizes: list[int] = field(default_factory=list)
    replaced: bool = True  # the replica holds the outer values (no step since)


@dataclass
class InFlight:
    """A fragment's sum on the wire: started after step `due - tau`, merged after `due`."""

    due: int
    sum: Sum | None  # None: already waited for (its result is in the fragment's inbox)
    started: float
    done_at: float | None = None  # when a poll first saw it finished


class StreamingSync:
    """Staggered, overlapped DiLoCo meetings of the fragments. All ranks call `after_step`."""

    def __init__(self, model: nn.Module, *, every: int, fragments: int, overlap: int,
                 alpha: float, outer_lr: float, outer_momentum: float,
                 outer_dtype: str) -> None:
        # Validation (tandem.config) keeps a fragment's sum merged before it meets again.
        assert 0 <= overlap < every and fragments <= every, (overlap, fragments, every)
        self.every, self.overlap, self.alpha = every, overlap, alpha
        self.outer_lr, self.outer_momentum, self.outer_dtype = outer_lr, outer_momentum, outer_dtype
        tensors = [p for p in model.parameters()] + [b for b in model.buffers()
                                                     if b.is_floating_point()]
        crooked = [i for i, t in enumerate(tensors) if not t.is_contiguous()]
        if crooked:
            raise ValueError(f"plan.strategy streaming_diloco: the model's tensors {crooked} "
                             "(parameters, then buffers) are not contiguous; fragments are "
                             "flat views of them: make them contiguous")
        self.tensors = tensors
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        for t in tensors:  # every replica starts from the same point
            dist.broadcast(t.data, src=0)
        # A group of its own: the sums in flight never queue the run's other collectives.
        self.group = dist.new_group()
        self.fragments = []
        for p, run in enumerate(slices([t.numel() for t in tensors], fragments)):
            views = [tensors[i].detach().view(-1)[a:b] for i, a, b in run]
            outer = flat(views)
            self.fragments.append(Fragment(
                views, p * every // fragments, outer, torch.zeros_like(outer),
                torch.zeros_like(outer), [v.numel() for v in views]))
        self.in_flight: dict[int, InFlight] = {}
        self.per_replica: dict[str, Any] = {}  # states each rank keeps its own of
        self._reset_counters()

    def _reset_counters(self) -> None:
        self.sent, self.syncs, self.peak = 0, 0, 0
        self.hidden_s, self.waited_s = 0.0, 0.0

    # ------------------------------------------------------------ each step
    def after_step(self, step: int, last: bool) -> None:
        """After optimizer step `step` (steps done so far): merge the sums due, start the
        fragments whose meeting this is; after the last step, meet to one model."""
        for f in self.fragments:
            f.replaced = False
        self._poll()
        for p, job in list(self.in_flight.items()):
            if job.due == step:
                self._merge(p, replace=False)
        for p, f in enumerate(self.fragments):
            if (step - f.offset) % self.every == 0:
                self._start(p, step)
                if self.overlap == 0:
                    self._merge(p, replace=True)
        if last:
            self.finish(step)

    def finish(self, step: int) -> None:
        """Merge every sum in flight, then meet (blocking, replacing) with every fragment
        the replicas may hold differently: all ranks then hold the same model."""
        for p in list(self.in_flight):
            self._merge(p, replace=False)
        for p, f in enumerate(self.fragments):
            if not f.replaced:
                self._start(p, step)
                self._merge(p, replace=True)

    def _poll(self) -> None:
        now = time.perf_counter()
        for job in self.in_flight.values():
            if job.done_at is None and job.sum is not None and job.sum.is_completed():
                job.done_at = now

    def _start(self, p: int, step: int) -> None:
        f = self.fragments[p]
        torch.sub(f.outer, flat(f.tensors), out=f.inbox)  # the pseudo-gradient
        summed = start_sum(f.inbox, f.sizes, self.outer_dtype, self.group)
        self.in_flight[p] = InFlight(step + self.overlap, summed, time.perf_counter())
        self.sent += summed.bytes_sent
        self.syncs += 1
        self.peak = max(self.peak, summed.bytes_sent)

    def _merge(self, p: int, replace: bool) -> None:
        f, job = self.fragments[p], self.in_flight.pop(p)
        if job.sum is not None:
            began = time.perf_counter()
            job.sum.wait()
            ended = time.perf_counter()
            self.hidden_s += (job.done_at or began) - job.started
            self.waited_s += ended - began if job.done_at is None else 0.0
        pseudo_grad = f.inbox / self.world
        f.velocity.mul_(self.outer_momentum).add_(pseudo_grad)
        f.outer.sub_(self.outer_lr * (pseudo_grad + self.outer_momentum * f.velocity))
        if replace:
            assign(f.outer, f.tensors)
        else:
            assign(torch.lerp(f.outer, flat(f.tensors), self.alpha), f.tensors)
        f.replaced = replace

    def take_figures(self, steps: int) -> dict[str, float]:
        """Bytes per step, per sync and of the largest sync, the share of the
        sums' time hidden behind inner steps and the wait at merges per step, since the
        last call (the hidden time is counted up to the first step that saw a sum done)."""
        figures = {COMM_BYTES_PER_STEP: self.sent / steps, COMM_MERGE_WAIT: self.waited_s / steps}
        if self.syncs:
            figures |= {COMM_BYTES_PER_SYNC: self.sent / self.syncs,
                        COMM_PEAK_BYTES_PER_SYNC: float(self.peak)}
        if self.hidden_s + self.waited_s > 0:
            figures[COMM_OVERLAP] = self.hidden_s / (self.hidden_s + self.waited_s)
        self._reset_counters()
        return figures

    # ------------------------------------------------------------ state
    def restart(self) -> None:
        """Outer parameters from the weights now held (the same on every rank), momentum
        zero, nothing in flight."""
        for f in self.fragments:
            f.outer.copy_(flat(f.tensors))
            f.velocity.zero_()
            f.replaced = True
        self.in_flight.clear()

    def state_dict(self) -> dict[str, Any]:
        """Outer parameters and momentum, this rank's replica (its own keys) and every
        sum in flight (waited for now: the same sum on every rank) with its due step."""
        for job in self.in_flight.values():
            if job.sum is not None:
                job.sum.wait()
                job.sum = None
        frags = {str(p): {"outer": f.outer, "velocity": f.velocity, "inbox": f.inbox}
                 for p, f in enumerate(self.fragments)}
        # Copies: the run's own model and optimizer sections hold the same tensors, and a
        # load into one storage from two sections would keep whichever came last.
        held = {name: state.state_dict() for name, state in self.per_replica.items()}
        replica = cloned({"weights": dict(enumerate(self.tensors)), **held})
        return {"fragments": frags, f"replica{self.rank}": replica,
                "due": {str(p): job.due for p, job in self.in_flight.items()},
                "replaced": [f.replaced for f in self.fragments], "world": self.world}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output (written at this world size)."""
        if state["world"] != self.world or f"replica{self.rank}" not in state:
            raise ValueError(f"plan.strategy streaming_diloco: the checkpoint holds the "
                             f"replicas of {state['world']} processes; resume it on "
                             f"{state['world']}, not {self.world}")
        for p, f in enumerate(self.fragments):
            saved = state["fragments"][str(p)]
            for key in ("outer", "velocity", "inbox"):
                getattr(f, key).copy_(saved[key])
            f.replaced = bool(state["replaced"][p])
        replica = state[f"replica{self.rank}"]
        with torch.no_grad():
            for i, t in enumerate(self.tensors):
                t.copy_(replica["weights"][str(i)])
        for name, held in self.per_replica.items():
            # The checkpoint's plain values (JSON) are the first rank's; the ranks share
            # their layout (the same parameter groups): this rank's tensors go over them.
            held.load_state_dict(overlay(state["replica0"].get(name), replica.get(name)))
        now = time.perf_counter()
        self.in_flight = {int(p): InFlight(int(due), None, now, now)
                          for p, due in state["due"].items()}


class StreamingDiLoCoStrategy(Strategy):
    """Streaming DiLoCo (see the module doc)."""

    info: ClassVar[StrategyInfo] = STREAMING_DILOCO
    sync: StreamingSync | None = None

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan = self.plan
        self.sync = StreamingSync(
            model, every=plan.sync_every, fragments=plan.fragments,
            overlap=plan.overlap_steps, alpha=plan.merge_alpha, outer_lr=plan.outer_lr,
            outer_momentum=plan.outer_momentum, outer_dtype=plan.outer_dtype)
        return model

    def after_step(self, step: int, last: bool) -> None:
        """Merge the sums due, start the fragments meeting now; one model after the last."""
        assert self.sync is not None, "wrap() first"
        self.sync.after_step(step, last)

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float]:
        """Bytes per step, per sync and at the peak; overlap achieved; wait at merges."""
        assert self.sync is not None, "wrap() first"
        return self.sync.take_figures(steps) if steps else {}

    def state_dict(self) -> dict[str, Any]:
        """The outer state, this rank's replica and the sums in flight."""
        assert self.sync is not None, "wrap() first"
        return self.sync.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""
        assert self.sync is not None, "wrap() first"
        self.sync.load_state_dict(state)

    def fresh_start(self) -> None:
        """Resumed from another plan's checkpoint: the outer parameters are its weights."""
        assert self.sync is not None, "wrap() first"
        self.sync.restart()

    def keep_per_replica(self, name: str, state: Any) -> None:
        """Keep this rank's own `state` (the optimizer's) in checkpoints."""
        assert self.sync is not None, "wrap() first"
        self.sync.per_replica[name] = state

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        plan = self.plan
        return {"strategy": self.name, "sync_every": plan.sync_every,
                "fragments": plan.fragments, "overlap_steps": plan.overlap_steps,
                "merge_alpha": plan.merge_alpha, "outer_dtype": plan.outer_dtype,
                "outer_lr": plan.outer_lr, "outer_momentum": plan.outer_momentum}
