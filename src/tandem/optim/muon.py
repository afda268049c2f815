"""Muon: momentum SGD whose update is orthogonalised by a Newton-Schulz iteration, with
AdamW for the parameters it should not touch (Jordan et al. 2024, the optimizer of the
modded-nanogpt and airbench speedruns)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from tandem.optim.layerwise import check_range
from tandem.parallel.host_allreduce import SharedMemoryGroup

log = logging.getLogger(__name__)

# The quintic's coefficients, chosen to push every singular value of the normalised
# matrix towards 1 in few steps (they land in about [0.7, 1.2], not exactly 1).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def orthogonalize(update: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """The Newton-Schulz approximation of U V^T for update = U S V^T (2-D, float32).

    A tensor of more dimensions is treated as a matrix of its first dimension by the
    rest (a convolution's kernels: output channels x the rest).
    """
    a, b, c = NS_COEFFICIENTS
    x = update.reshape(update.shape[0], -1).float()
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    if tall:
        x = x.T
    return x.reshape(update.shape).to(update.dtype)


def _orthogonal_update(update: torch.Tensor, steps: int) -> torch.Tensor:
    """`orthogonalize` for plain tensors and DTensor shards (FSDP2, tensor parallel).

    A shard is only part of the matrix: the whole matrix is gathered, orthogonalised the
    same way on every rank, and each rank keeps its own part (no second collective).
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(update, DTensor):
        return orthogonalize(update, steps)
    whole = orthogonalize(update.full_tensor(), steps)
    return distribute_tensor(whole, update.device_mesh, update.placements, src_data_rank=None)


def _balance(sizes: list[int], world: int) -> list[int]:
    """The process that orthogonalises each matrix: largest first, to the least loaded
    (the same answer on every process)."""
    load = [0] * world
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        r = min(range(world), key=lambda q: (load[q], q))
        owner[i] = r
        load[r] += sizes[i]
    return owner


class Muon(Optimizer):
    """Muon for matrices and convolution kernels, AdamW for groups marked ``muon=False``.

    A Muon group's parameter p with gradient g, momentum buffer m and momentum beta:

        m = beta * m + (1 - beta) * g
        u = (1 - beta) * g + beta * m      (nesterov; else u = m)
        o = orthogonalize(u) * sqrt(max(1, rows / cols))
        p = p * (1 - lr * weight_decay) - lr * o

    An AdamW group (``{"params": ..., "muon": False, "lr": ..., "betas": ...}``: embeddings,
    output heads, biases, norms) takes torch's AdamW step with bias correction. Every group
    has an ``lr``, which tandem's schedules scale like any other optimizer's.

    The orthogonalisations are most of Muon's cost. Where every process holds the same
    replica and steps with it (DDP), tandem calls `share_work`: each process then
    orthogonalises its share of the matrices and one all-gather hands out the rest. For
    small matrices the all-gather costs more than it saves, so the first steps time both
    ways (`TRIAL_STEPS` each, alone first) and the processes keep the faster one, agreed
    by one all-reduce; the update is the same either way.
    """

    TRIAL_STEPS = 4
    """Steps timed each way (the fastest of each counts) before sharing is decided."""

    def __init__(self, params: Iterable[Any], lr: float = 0.02, momentum: float = 0.95,
                 nesterov: bool = True, ns_steps: int = 5, weight_decay: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8) -> None:
        check_range("lr", lr, 0.0)
        check_range("momentum", momentum, 0.0, 1.0)
        check_range("weight_decay", weight_decay, 0.0)
        for i, beta in enumerate(betas):
            check_range(f"betas[{i}]", beta, 0.0, 1.0)
        if ns_steps < 1:
            raise ValueError(f"ns_steps: {ns_steps!r} is out of range; expected an integer >= 1")
        defaults = {"lr": lr, "momentum": momentum, "nesterov": nesterov, "ns_steps": ns_steps,
                    "weight_decay": weight_decay, "betas": tuple(betas), "eps": eps,
                    "muon": True}
        super().__init__(params, defaults)
        for i, group in enumerate(self.param_groups):
            if group["muon"]:
                flat = [tuple(p.shape) for p in group["params"] if p.dim() < 2]
                if flat:
                    raise ValueError(f"Muon: param group {i} holds parameters of shapes {flat}; "
                                     "Muon orthogonalises matrices: put vectors and scalars "
                                     "in a group with muon=False (AdamW)")
            else:
                group.pop("momentum", None)  # an AdamW group: its momentum is betas[0]
        self._group: dist.ProcessGroup | None = None
        self._host: SharedMemoryGroup | None = None
        self._sharing = False
        self._trial: list[list[float]] | None = None
        self.sharing_timed: tuple[float, float] | None = None
        """Seconds a step's orthogonalisations took (alone, shared), the slowest process's
        fastest step each way, once sharing has been decided."""

    def share_work(self, group: dist.ProcessGroup | None,
                   host: SharedMemoryGroup | None = None) -> None:
        """Split the orthogonalisations of plain (replicated) parameters over the processes
        of `group` (None: the default group) where that is measured to be faster. Only where
        every process of the group holds the same parameters and gradients at every step;
        every process must call `step`. `host`: the same processes' shared-memory group,
        to gather the results through instead of the process group."""
        self._group, self._sharing, self._trial = group, False, [[], []]
        self._host = host

    @property
    def shares_work(self) -> bool:
        """Whether the orthogonalisations are split over the processes (False until the
        first steps have timed both ways)."""
        return self._sharing

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """Update every parameter that has a gradient; returns the closure's loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pending: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] = []
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                if not group["muon"]:
                    self._adamw(param, group)
                    continue
                direction = self._direction(param, group)
                if type(direction) is torch.Tensor:
                    pending.append((param, direction, group))
                else:  # a DTensor shard: gathered and orthogonalised on its own
                    self._apply(param, _orthogonal_update(direction, group["ns_steps"]), group)
        steps = self._orthogonalize_all([(d, g["ns_steps"]) for _, d, g in pending])
        for (param, _, group), step in zip(pending, steps, strict=True):
            self._apply(param, step, group)
        return loss

    def _direction(self, param: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """Advance the momentum; the direction to orthogonalise (Nesterov or not)."""
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param)
        buffer, grad, beta = state["momentum_buffer"], param.grad, group["momentum"]
        buffer.lerp_(grad, 1 - beta)
        return grad.lerp(buffer, beta) if group["nesterov"] else buffer

    @staticmethod
    def _apply(param: torch.Tensor, step: torch.Tensor, group: dict[str, Any]) -> None:
        rows, cols = param.shape[0], param[0].numel()
        if group["weight_decay"]:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        param.add_(step, alpha=-group["lr"] * max(1.0, rows / cols) ** 0.5)

    def _orthogonalize_all(self, work: list[tuple[torch.Tensor, int]]) -> list[torch.Tensor]:
        """`orthogonalize` of each (direction, steps), shared over the group if faster."""
        if self._trial is None or not work:
            return self._orthogonalize(work, self._sharing)
        alone, shared = self._trial
        share = len(alone) >= self.TRIAL_STEPS
        started = time.perf_counter()
        out = self._orthogonalize(work, share)
        (shared if share else alone).append(time.perf_counter() - started)
        if len(shared) == self.TRIAL_STEPS:
            timed = torch.tensor([min(alone), min(shared)], dtype=torch.float64)
            dist.all_reduce(timed, op=dist.ReduceOp.MAX, group=self._group)
            self.sharing_timed = (float(timed[0]), float(timed[1]))
            self._sharing, self._trial = self.sharing_timed[1] < self.sharing_timed[0], None
            log.info("Muon: orthogonalisations %s (a step's took %.2f ms alone, %.2f ms "
                     "shared over %d processes)",
                     "shared" if self._sharing else "on every process",
                     1e3 * self.sharing_timed[0], 1e3 * self.sharing_timed[1],
                     dist.get_world_size(self._group))
        return out

    def _orthogonalize(self, work: list[tuple[torch.Tensor, int]],
                       share: bool) -> list[torch.Tensor]:
        world = dist.get_world_size(self._group) if share else 1
        if world == 1 or not work:
            return [orthogonalize(d, steps) for d, steps in work]
        owner = _balance([d.numel() for d, _ in work], world)
        rank = dist.get_rank(self._group)
        mine = [i for i, o in enumerate(owner) if o == rank]
        sizes = [sum(work[i][0].numel() for i, o in enumerate(owner) if o == r)
                 for r in range(world)]
        like = work[0][0]
        flat = torch.zeros(max(sizes), dtype=like.dtype, device=like.device)
        if mine:
            torch.cat([orthogonalize(*work[i]).flatten() for i in mine],
                      out=flat[: sizes[rank]])
        if self._host is not None and flat.device.type == "cpu":
            parts = self._host.all_gather(flat)
        else:
            parts = [torch.empty_like(flat) for _ in range(world)]
            dist.all_gather(parts, flat, group=self._group)
        out: list[torch.Tensor] = [like] * len(work)
        offsets = [0] * world
        for i, (direction, _) in enumerate(work):
            r, n = owner[i], direction.numel()
            out[i] = parts[r][offsets[r]: offsets[r] + n].view_as(direction)
            offsets[r] += n
        return out

    def _adamw(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param)
            state["exp_avg_sq"] = torch.zeros_like(param)
        beta1, beta2 = group["betas"]
        state["step"] += 1
        t = float(state["step"])
        grad, exp_avg, exp_avg_sq = param.grad, state["exp_avg"], state["exp_avg_sq"]
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq / (1 - beta2**t)).sqrt_().add_(group["eps"])
        if group["weight_decay"]:
            param.mul_(1 - group["lr"] * group["weight_decay"])
        param.addcdiv_(exp_avg, denom, value=-group["lr"] / (1 - beta1**t))
