"""Data parallelism with DistributedDataParallel and an optional gradient comm hook."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import ClassVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tandem.clocks import Mark
from tandem.monitor.catalogue import COMM_BUCKETS_PER_STEP, COMM_BYTES_PER_STEP
from tandem.parallel import hooks, host_allreduce
from tandem.parallel.hierarchical import register_hierarchical
from tandem.parallel.host_allreduce import SharedMemoryGroup
from tandem.parallel.registry import DDP, StrategyInfo
from tandem.parallel.strategy import Build, Pass, Strategy, fresh_copy

log = logging.getLogger("tandem")


class DDPStrategy(Strategy):
    """Every rank holds a replica; DDP all-reduces gradient buckets during backward."""

    info: ClassVar[StrategyInfo] = DDP
    identical_replicas: ClassVar[bool] = True

    stats: hooks.CommStats | None = None  # bytes the comm hook sent
    host: SharedMemoryGroup | None = None  # the shared-memory all-reduce, where it is used

    def _wrap(self, model: nn.Module) -> nn.Module:
        plan, device = self.plan, self.runtime.device
        ddp = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=plan.bucket_mb,
            static_graph=plan.static_graph,
            find_unused_parameters=plan.find_unused,
            gradient_as_bucket_view=True,
        )
        self._register_hook(ddp)
        return ddp

    def _register_hook(self, ddp: DistributedDataParallel) -> None:
        plan, runtime = self.plan, self.runtime
        if plan.comm_hook != "hierarchical":
            if plan.comm_hook == "none":
                self.host = self._host_allreduce(ddp)
            self.stats = hooks.register(
                ddp, plan.comm_hook, backend=dist.get_backend(),
                powersgd_rank=plan.powersgd_rank, powersgd_warmup=plan.powersgd_warmup,
                topk_ratio=plan.topk_ratio, host=self.host)
        elif runtime.local_world_size in (1, runtime.world_size):
            # One node (or one process per node): two levels would only add a step.
            log.warning("plan.comm_hook 'hierarchical' on %d node(s) of %d processes: using "
                        "DDP's flat all-reduce", runtime.world_size // runtime.local_world_size,
                        runtime.local_world_size)
        else:
            register_hierarchical(ddp, runtime.local_world_size)

    def _host_allreduce(self, ddp: DistributedDataParallel) -> SharedMemoryGroup | None:
        """The shared-memory all-reduce where plan.host_allreduce allows it and every
        process maps one segment (collective: all ranks decide together)."""
        choice = self.plan.host_allreduce
        if choice == "backend":
            return None
        problem = host_allreduce.unsupported(self.runtime.device)
        if problem is None:
            slot = host_allreduce.slot_bytes(
                [q for q in ddp.module.parameters() if q.requires_grad], ddp.process_group)
            try:
                return SharedMemoryGroup(ddp.process_group, slot, self.plan.timeout_s)
            except OSError as err:
                problem = str(err)
        if choice == "shared_memory":
            raise RuntimeError(f"plan.host_allreduce 'shared_memory': cannot be used here: "
                               f"{problem}; use 'auto' or 'backend'")
        log.info("gradient all-reduce: the process group's (%s)", problem)
        return None

    def shared_memory(self) -> SharedMemoryGroup | None:
        """The shared-memory group DDP's gradients go through, where they do."""
        return self.host

    @property
    def module(self) -> nn.Module:
        """The user's module inside DDP."""
        assert isinstance(self.model, DistributedDataParallel), "wrap() first"
        return self.model.module

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """DDP's no_sync: gradients accumulate locally until the last micro-batch."""
        assert isinstance(self.model, DistributedDataParallel), "wrap() first"
        return self.model.no_sync()

    def window_figures(self, steps: int, micro_batches: int) -> dict[str, float]:
        """What the comm hook sent per step (DDP's own all-reduce: from the sizes)."""
        stats = self.stats
        if stats is not None and stats.steps:
            return {COMM_BYTES_PER_STEP: stats.bytes_per_step(),
                    COMM_BUCKETS_PER_STEP: float(stats.buckets)}
        return {}

    def take_comm_mark(self) -> Mark | None:
        """When the last bucket was ready: backward waits from there for the all-reduce."""
        return self.stats.take_last_ready() if self.stats is not None else None

    def arm_gradient_probe(self) -> None:
        """Measure this rank's own gradient (before the all-reduce) in the next backward."""
        if self.stats is not None:
            self.stats.armed, self.stats.local_sq = True, None

    def take_local_grad_sq(self) -> torch.Tensor | None:
        """|g_local|^2 that the armed probe measured (None: not measured)."""
        return self.stats.take_local_sq() if self.stats is not None else None

    @contextlib.contextmanager
    def calibrating(self, one_pass: Pass) -> Iterator[None]:
        """A hook with memory (PowerSGD's error feedback, top-k residuals, their step
        counters) must not remember calibration passes: its state is put back after."""
        saved = self.stats.save() if self.stats is not None else None
        try:
            yield
        finally:
            if self.stats is not None and saved is not None:
                self.stats.restore(saved)

    def export_model(self, build: Build) -> nn.Module:
        """A fresh module with the replica's weights (DDP's hooks hold the group)."""
        return fresh_copy(build, self.module, self.runtime.device)

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        return {"strategy": self.name, "bucket_mb": self.plan.bucket_mb,
                "comm_hook": self.plan.comm_hook, "static_graph": self.plan.static_graph,
                "allreduce": "shared_memory" if self.host is not None else "backend"}
