"""Goodput = throughput x statistical efficiency, and the batch configuration that maximises it."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tandem.sched.policies.efficiency import EfficiencyModel
from tandem.sched.policies.job import BatchLimits
from tandem.sched.policies.throughput import ThroughputModel

# Candidate global batches tried between the smallest and the largest allowed one.
BATCH_CANDIDATES = 48


@dataclass(frozen=True)
class BatchConfig:
    """How a job runs at one size: micro-batch, accumulation steps, and what that yields."""

    local_bsz: int
    """Samples per process per micro-batch."""
    accum_steps: int
    """Extra accumulated micro-batches per optimizer step."""
    batch: int
    """Global batch = procs * local_bsz * (accum_steps + 1)."""
    goodput: float
    """Predicted samples/s times efficiency (samples/s at the base batch's worth)."""


def split_batch(batch: int, procs: int, limits: BatchLimits) -> tuple[int, int]:
    """Micro-batch and accumulation steps that run global `batch` on `procs` processes.

    Accumulates only when the per-process share exceeds `limits.max_local`; rounds the
    micro-batch up, and keeps the global batch within `limits.max_batch`.
    """
    local = math.ceil(batch / procs - 1e-8)
    accum = max(0, math.ceil(local / limits.max_local - 1e-8) - 1)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = max(1, min(atomic, limits.max_batch // (procs * (accum + 1))))
    return atomic, accum


@dataclass(frozen=True)
class GoodputModel:
    """A job's goodput at any size, from its throughput and efficiency models."""

    throughput: ThroughputModel
    efficiency: EfficiencyModel
    limits: BatchLimits
    adapt_batch: bool = True
    """False: the job keeps its base batch; True: it may grow it for goodput."""

    def evaluate(self, nodes: int, procs: int, local_bsz: int, accum_steps: int) -> float:
        """Predicted goodput of one configuration."""
        batch = procs * local_bsz * (accum_steps + 1)
        step = self.throughput.step_time(nodes, procs, local_bsz, accum_steps)
        return batch / step * self.efficiency.efficiency(batch)

    def best(self, nodes: int, procs: int) -> BatchConfig:
        """The goodput-maximising configuration on `procs` processes over `nodes` nodes."""
        if procs < 1 or nodes < 1 or nodes > procs:
            raise ValueError(f"nodes {nodes}, procs {procs}: need 1 <= nodes <= procs")
        return _best_config(self, nodes, procs)

    def curve(self, max_procs: int, slots_per_node: int) -> np.ndarray:
        """Best goodput at 0..max_procs processes, each packed on as few nodes as possible."""
        procs = np.arange(1, max_procs + 1)
        goodput, _, _ = self._best(-(-procs // slots_per_node), procs)
        return np.concatenate(([0.0], goodput))

    def _best(self, nodes: np.ndarray, procs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Best (goodput, micro-batch, accumulation) for each (nodes, procs) pair, vectorised."""
        base = self.efficiency.base_batch
        procs_col = procs[:, None].astype(float)
        if self.adapt_batch:
            low = np.maximum(base, self.limits.min_local * procs_col)
            high = np.maximum(low, self.limits.max_batch)
            ramp = np.linspace(0.0, 1.0, BATCH_CANDIDATES)[None, :]
            batches = low * (high / low) ** ramp
        else:
            batches = np.full((len(procs), 1), float(base))
        local = np.ceil(batches / procs_col - 1e-8)
        accum = np.maximum(0, np.ceil(local / self.limits.max_local - 1e-8) - 1)
        atomic = np.ceil(local / (accum + 1) - 1e-8)
        cap = np.floor(self.limits.max_batch / (procs_col * (accum + 1)))
        atomic = np.maximum(1, np.minimum(atomic, cap))
        total = procs_col * atomic * (accum + 1)
        t = self.throughput
        compute = t.compute_const + t.compute_per_sample * atomic
        spread = (t.inter_const + t.inter_per_proc * (procs - 2))
        inside = (t.intra_const + t.intra_per_proc * (procs - 2))
        sync = np.where(procs <= 1, 0.0, np.where(nodes <= 1, inside, spread))[:, None]
        step = (accum + 1) * compute + sync
        eff = self.efficiency
        worth = (1.0 if math.isinf(eff.noise_scale)
                 else (eff.noise_scale + base) / (eff.noise_scale + total))
        goodput = total / step * worth
        best = np.argmax(goodput, axis=1)
        rows = np.arange(len(procs))
        return goodput[rows, best], atomic[rows, best], accum[rows, best]


@functools.lru_cache(maxsize=1 << 16)
def _best_config(model: GoodputModel, nodes: int, procs: int) -> BatchConfig:
    """Memoised `GoodputModel.best`: the models are immutable, so equal inputs agree."""
    goodput, atomic, accum = model._best(np.array([nodes]), np.array([procs]))
    batch = procs * int(atomic[0]) * (int(accum[0]) + 1)
    return BatchConfig(int(atomic[0]), int(accum[0]), batch, float(goodput[0]))
