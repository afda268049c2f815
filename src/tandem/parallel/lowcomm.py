"""Low-communication data parallelism: local SGD and DiLoCo.

Each rank trains its own replica with no gradient synchronisation; every H steps the
replicas meet:

- local SGD (Stich, 2019; Lin et al., 2020) averages the parameters;
- DiLoCo (Douillard et al., 2023) treats the change since the last meeting, averaged
  over ranks, as a pseudo-gradient of the shared "outer" parameters and applies an
  outer Nesterov-momentum SGD step to them; every replica then restarts from the new
  outer parameters.

Either sends the model once per H steps instead of the gradients every step: about
1/H of the bytes of DDP. Buffers (e.g. normalisation statistics) are averaged too.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from tandem.monitor.catalogue import (
    COMM_BYTES_PER_STEP,
    COMM_BYTES_PER_SYNC,
    COMM_PEAK_BYTES_PER_SYNC,
)
from tandem.parallel.registry import DILOCO, LOCALSGD, StrategyInfo, either, names
from tandem.parallel.strategy import Strategy


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    with torch.no_grad():
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n


class LowCommSync:
    """Meets the other replicas every `every` optimizer steps. All ranks call `after_step`."""

    def __init__(self, model: nn.Module, *, method: str, every: int, outer_lr: float = 0.7,
                 outer_momentum: float = 0.9) -> None:
        if method not in names("meets_every"):
            raise ValueError(f"plan.strategy: {method!r} is not a low-communication method; "
                             f"use {either(names('meets_every'))}")
        if every < 1:
            raise ValueError(f"plan.sync_every: {every} must be >= 1")
        self.method, self.every = method, every
        self.tensors = [p for p in model.parameters()] + [b for b in model.buffers()
                                                          if b.is_floating_point()]
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.bytes_sent, self.syncs, self.peak = 0, 0, 0
        self._broadcast_start()
        self.outer = _flat(self.tensors)  # DiLoCo's shared parameters
        self.velocity = torch.zeros_like(self.outer)
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum

    def _broadcast_start(self) -> None:
        # Every replica must start from the same point (DDP does this at wrap time).
        if self.world > 1:
            for t in self.tensors:
                dist.broadcast(t.data, src=0)

    def _average(self) -> torch.Tensor:
        flat = _flat(self.tensors)
        if self.world > 1:
            dist.all_reduce(flat)
            flat /= self.world
            # A ring all-reduce sends 2 (N-1)/N of the buffer from every rank.
            sent = int(2 * (self.world - 1) / self.world * flat.numel() * 4)
            self.bytes_sent += sent
            self.syncs += 1
            self.peak = max(self.peak, sent)
        return flat

    def take_figures(self, steps: int) -> dict[str, float]:
        """Bytes this rank sent per step, per meeting and in the largest meeting since the
        last call."""
        figures = {COMM_BYTES_PER_STEP: self.bytes_sent / steps}
        if self.syncs:
            figures |= {COMM_BYTES_PER_SYNC: self.bytes_sent / self.syncs,
                        COMM_PEAK_BYTES_PER_SYNC: float(self.peak)}
        self.bytes_sent, self.syncs, self.peak = 0, 0, 0
        return figures

    def after_step(self, step: int, force: bool = False) -> bool:
        """Meet when `step` (steps done so far) is a multiple of H, or when forced."""
        if step % self.every and not force:
            return False
        averaged = self._average()
        if self.method == LOCALSGD.name:
            _unflatten_into(averaged, self.tensors)
            return True
        pseudo_grad = self.outer - averaged
        self.velocity.mul_(self.outer_momentum).add_(pseudo_grad)
        update = pseudo_grad + self.outer_momentum * self.velocity  # Nesterov
        self.outer -= self.outer_lr * update
        _unflatten_into(self.outer, self.tensors)
        return True

    def restart(self) -> None:
        """DiLoCo's outer parameters from the weights now held, momentum zero."""
        self.outer.copy_(_flat(self.tensors))
        self.velocity.zero_()

    def state_dict(self) -> dict[str, torch.Tensor]:
        """DiLoCo's outer parameters and momentum (checkpointed with the model)."""
        return {"outer": self.outer, "velocity": self.velocity}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore `state_dict` output."""
        self.outer.copy_(state["outer"])
        self.velocity.copy_(state["velocity"])


class LowCommStrategy(Strategy):
    """Replicas train alone and meet every `plan.sync_every` steps (see the module doc)."""

    info: ClassVar[StrategyInfo] = LOCALSGD
    meetings: LowCommSync | None = None

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan = self.plan
        self.meetings = LowCommSync(model, method=self.name, every=plan.sync_every,
                                    outer_lr=plan.outer_lr,
                                    outer_momentum=plan.outer_momentum)
        return model

    def after_step(self, step: int, last: bool) -> None:
        """Meet when `step` is a multiple of H, and always after the last step."""
        assert self.meetings is not None, "wrap() first"
        self.meetings.after_step(step, force=last)

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float]:
        """Bytes per step and per meeting (the meetings' time is the trainer's `comm`
        phase)."""
        assert self.meetings is not None, "wrap() first"
        return self.meetings.take_figures(steps) if steps else {}

    def state_dict(self) -> dict[str, Any]:
        """DiLoCo's outer parameters and momentum (kept for local SGD too: one format)."""
        assert self.meetings is not None, "wrap() first"
        return self.meetings.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""
        assert self.meetings is not None, "wrap() first"
        self.meetings.load_state_dict(state)

    def fresh_start(self) -> None:
        """Resumed from another plan's checkpoint: the outer parameters are its weights."""
        assert self.meetings is not None, "wrap() first"
        self.meetings.restart()

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        entries: dict[str, object] = {"strategy": self.name,
                                      "sync_every": self.plan.sync_every}
        if self.name == DILOCO.name:
            entries |= {"outer_lr": self.plan.outer_lr,
                        "outer_momentum": self.plan.outer_momentum}
        return entries


class DiLoCoStrategy(LowCommStrategy):
    """DiLoCo: an outer Nesterov step on the replicas' averaged change at each meeting."""

    info: ClassVar[StrategyInfo] = DILOCO
