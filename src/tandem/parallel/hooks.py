"""DDP gradient-communication hooks chosen by name, and the bytes each one sends."""

# No `from __future__ import annotations`: DDP's register_comm_hook compares the hook's
# annotations with the real `dist.GradBucket` and `Future[Tensor]` types, and string
# annotations fail that check.

import copy
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    powerSGD_hook,
)
from torch.nn.parallel import DistributedDataParallel

from tandem.clocks import mark
from tandem.parallel.host_allreduce import SharedMemoryGroup
from tandem.parallel.topk import TopKState, topk_hook

log = logging.getLogger("tandem")

HOOKS = ("none", "fp16", "bf16", "powersgd", "topk")

Hook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def ring_allreduce_bytes(nbytes: float, world: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `nbytes` (reduce-scatter + all-gather)."""
    return 2.0 * (world - 1) / world * nbytes


class CommStats:
    """Bytes this rank sends per optimizer step through DDP's gradient communication.

    A hook adds the bytes of each bucket it communicates; the step ends at DDP's last
    bucket. `bytes_per_step` averages the last `window` steps, so a hook that changes
    behaviour (PowerSGD after its warm-up) reports what it sends now.
    """

    def __init__(self, hook: str, world_size: int, window: int = 20) -> None:
        self.hook = hook
        self.world_size = world_size
        self._steps: deque[float] = deque(maxlen=window)
        self._current = 0.0
        self.steps = 0
        self.state: Any = None  # the hook's own state (error feedback, residuals, counters)
        # The gradient-noise probe: while armed, the squared norm of this rank's own
        # gradient (each bucket before it is communicated) is summed here, on the device.
        self.armed = False
        self.local_sq: torch.Tensor | None = None
        # When this rank's last gradient bucket became ready (host clock, or a CUDA event
        # on the backward stream): backward waits from here until the all-reduce is done.
        self.last_ready: float | torch.cuda.Event | None = None
        self.buckets = 0  # buckets per step (the wire-time model counts their latency)

    def ready(self, bucket: dist.GradBucket) -> None:
        """Note when the step's last bucket is ready to be communicated."""
        if bucket.is_last():
            self.buckets = bucket.index() + 1
            self.last_ready = mark(bucket.buffer().is_cuda)

    def take_last_ready(self) -> float | torch.cuda.Event | None:
        """When the last step's last bucket was ready (None: no synchronised backward)."""
        found, self.last_ready = self.last_ready, None
        return found

    def probe(self, bucket: dist.GradBucket) -> None:
        """Add this bucket's squared norm, before any communication, when armed."""
        if self.armed:
            sq = bucket.buffer().detach().float().pow(2).sum()
            self.local_sq = sq if self.local_sq is None else self.local_sq + sq

    def take_local_sq(self) -> torch.Tensor | None:
        """The summed squared norm since arming (None if nothing was seen); disarm."""
        found, self.local_sq, self.armed = self.local_sq, None, False
        return found

    def save(self) -> dict[str, Any]:
        """A copy of the counters and of the hook's state, for `restore` (calibration)."""
        state = {}
        if self.state is not None:
            names = getattr(type(self.state), "__slots__", None) or list(vars(self.state))
            for name in names:
                if name == "process_group" or not hasattr(self.state, name):
                    continue
                state[name] = copy.deepcopy(getattr(self.state, name))
        return {"steps": (deque(self._steps, maxlen=self._steps.maxlen), self._current,
                          self.steps), "state": state}

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back what `save` copied: passes in between leave no trace in later steps."""
        self._steps, self._current, self.steps = saved["steps"]
        for name, value in saved["state"].items():
            setattr(self.state, name, value)

    def add(self, nbytes: float, last_bucket: bool) -> None:
        """Count one bucket's bytes; `last_bucket` closes the step."""
        self._current += nbytes
        if last_bucket:
            self._steps.append(self._current)
            self._current = 0.0
            self.steps += 1

    def bytes_per_step(self) -> float:
        """Mean bytes sent per step over the last steps (0.0 before the first step)."""
        return sum(self._steps) / len(self._steps) if self._steps else 0.0


def _bucket_bytes(bucket: dist.GradBucket) -> int:
    buffer = bucket.buffer()
    return buffer.numel() * buffer.element_size()


def _powersgd_bytes(state: PowerSGDState, bucket: dist.GradBucket, world: int) -> float:
    """What powerSGD_hook will send for this bucket: its own split of the tensors.

    Mirrors torch's rule: a tensor viewed as an n x m matrix is compressed to P (n x r)
    and Q (m x r) when (n + m) * r * min_compression_rate < n * m; others (all 1-D
    tensors among them) are all-reduced as they are. All three go by ring all-reduce.
    """
    if state.iter < state.start_powerSGD_iter:
        return ring_allreduce_bytes(_bucket_bytes(bucket), world)
    elements = 0
    for tensor in bucket.gradients():
        n = tensor.shape[0] if tensor.ndim else 1
        m = tensor.numel() // max(n, 1)
        r = min(n, m, state.matrix_approximation_rank)
        if (n + m) * r * state.min_compression_rate < n * m:
            elements += (n + m) * r
        else:
            elements += tensor.numel()
    return ring_allreduce_bytes(elements * bucket.buffer().element_size(), world)


def _counted(inner: Hook, stats: CommStats,
             measure: Callable[[dist.GradBucket], float]) -> Hook:
    """`inner`, counting the bytes `measure` reports for each bucket first."""

    def hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        # Measured before `inner` runs: PowerSGD advances its step counter inside, and
        # compression (or the all-reduce itself) changes the buffer.
        stats.add(measure(bucket), bucket.is_last())
        stats.probe(bucket)
        stats.ready(bucket)
        return inner(state, bucket)

    hook.__name__ = hook.__qualname__ = f"counted_{inner.__name__}"
    return hook


def host_allreduce_hook(state: SharedMemoryGroup,
                        bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's mean all-reduce of one bucket through the host's shared memory (in place)."""
    buffer = state.all_reduce(bucket.buffer(), mean=True)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(buffer)
    return done


def _check(name: str, backend: str, powersgd_rank: int, powersgd_warmup: int,
           topk_ratio: float) -> None:
    if name not in HOOKS:
        raise ValueError(f"comm hook: {name!r} is not known; choose one of {list(HOOKS)}")
    if name == "bf16" and backend == "gloo":
        raise ValueError(
            "comm hook: 'bf16' cannot run on the gloo backend, which rejects bf16 "
            "all-reduce; use 'fp16' on gloo, or the nccl backend"
        )
    if name == "powersgd" and powersgd_rank < 1:
        raise ValueError(f"powersgd_rank: {powersgd_rank!r} is out of range; expected >= 1")
    if name == "powersgd" and powersgd_warmup < 2:
        raise ValueError(
            f"powersgd_warmup: {powersgd_warmup!r} is out of range; expected >= 2 (DDP "
            "rebuilds its buckets after the first step, and PowerSGD's error feedback "
            "and warm start are kept per bucket)"
        )
    if name == "topk" and not 0.0 < topk_ratio <= 1.0:
        raise ValueError(f"topk_ratio: {topk_ratio!r} is out of range; expected (0, 1]")


def register(ddp: DistributedDataParallel, name: str, *, backend: str,
             powersgd_rank: int = 2, powersgd_warmup: int = 10,
             topk_ratio: float = 0.01, host: SharedMemoryGroup | None = None) -> CommStats:
    """Register the gradient-communication hook `name` on `ddp`; return its byte counter.

    none: DDP's own fp32 all-reduce; fp16 / bf16: all-reduce in half precision;
    powersgd: torch's PowerSGD (rank `powersgd_rank`, plain all-reduce for the first
    `powersgd_warmup` steps, error feedback, warm start); topk: the `topk_ratio` largest
    entries of each bucket with error feedback (tandem.parallel.topk). `host`: with 'none',
    carry the all-reduce through this shared segment instead of the process group (the
    same mean, the same bytes counted). Must be called on
    all processes with the same arguments, before the first forward.
    """
    _check(name, backend, powersgd_rank, powersgd_warmup, topk_ratio)
    world = dist.get_world_size(ddp.process_group)
    stats = CommStats(name, world)
    group = ddp.process_group
    if name == "none" and host is not None:
        ddp.register_comm_hook(host, _counted(
            host_allreduce_hook, stats,
            lambda b: ring_allreduce_bytes(_bucket_bytes(b), world)))
    elif name == "none":  # DDP's own fp32 all-reduce, counted and probed
        ddp.register_comm_hook(group, _counted(
            default_hooks.allreduce_hook, stats,
            lambda b: ring_allreduce_bytes(_bucket_bytes(b), world)))
    elif name in ("fp16", "bf16"):
        inner = default_hooks.fp16_compress_hook if name == "fp16" else (
            default_hooks.bf16_compress_hook)
        half = _counted(inner, stats,
                        lambda b: ring_allreduce_bytes(b.buffer().numel() * 2, world))
        ddp.register_comm_hook(group, half)
    elif name == "powersgd":
        state = PowerSGDState(process_group=group, matrix_approximation_rank=powersgd_rank,
                              start_powerSGD_iter=powersgd_warmup, use_error_feedback=True,
                              warm_start=True)
        ddp.register_comm_hook(
            state, _counted(powerSGD_hook, stats, lambda b: _powersgd_bytes(state, b, world)))
        stats.state = state
    else:
        topk = TopKState(topk_ratio, group)
        ddp.register_comm_hook(topk, _counted(
            topk_hook, stats,
            lambda b: (world - 1) * topk.payload_bytes(b.buffer().numel(), b.buffer().dtype)))
        stats.state = topk
    log.info("comm hook: %s on %d ranks%s", name, world,
             " (all-reduce through shared memory)" if host is not None else "")
    return stats
