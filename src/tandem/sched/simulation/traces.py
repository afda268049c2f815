"""Measured traces of real training jobs (the Pollux traces): the ground truth of the simulator.

Per application the traces hold step and synchronisation time per placement and per-GPU
batch (`placements.csv`, plus `scalability.csv` for 6 to 16 nodes), and per global batch
the validation curve with gradient statistics at every epoch (`validation-<batch>.csv`).
This module answers three questions by interpolating between measurements:

- how long a step takes on a placement at a micro-batch (`step_sync`);
- how noisy the gradient is at a batch in an epoch (`grad_stats`);
- how much progress (steps at the base batch, efficiency-weighted) ends an epoch.

Only CSV is read; nothing is unpickled.
"""

from __future__ import annotations

import bisect
import csv
import functools
from dataclasses import dataclass
from pathlib import Path

from tandem.sched.policies.job import BatchLimits

# How long each application trains and its memory limit, as in the published simulations
# the traces come with (epochs of the validation curves; yolov3 fits 8 images per GPU).
APPLICATION_SETTINGS: dict[str, dict[str, int]] = {
    "bert": {"max_epochs": 2},
    "cifar10": {"max_epochs": 100},
    "deepspeech2": {"max_epochs": 80},
    "imagenet": {"max_epochs": 90},
    "ncf": {"max_epochs": 10},
    "yolov3": {"max_epochs": 50, "max_local": 8},
}

Row = tuple[float, float, float]  # (local_bsz, step_time, sync_time)


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _lerp(rows: list[Row], x: float) -> tuple[float, float]:
    """Piecewise-linear (step, sync) at micro-batch x; linear extrapolation past the ends."""
    if len(rows) == 1:
        return rows[0][1], rows[0][2]
    i = min(max(bisect.bisect_left([r[0] for r in rows], x), 1), len(rows) - 1)
    (x0, s0, c0), (x1, s1, c1) = rows[i - 1], rows[i]
    w = (x - x0) / (x1 - x0)
    if x < x0:  # below the smallest measured micro-batch: hold the first measurement
        return s0, c0
    return s0 + w * (s1 - s0), c0 + w * (c1 - c0)


def _bracket(keys: list[int], x: float) -> tuple[int, int, float]:
    """Neighbours of x among sorted keys (clamped to the ends) and x's weight on the upper."""
    if x <= keys[0]:
        return keys[0], keys[0], 0.0
    if x >= keys[-1]:
        return keys[-1], keys[-1], 0.0
    i = bisect.bisect_left(keys, x)
    lo, hi = keys[i - 1], keys[i]
    if hi == x:
        return hi, hi, 0.0
    return lo, hi, (x - lo) / (hi - lo)


@dataclass(frozen=True)
class ValidationRow:
    progress: float
    grad_sqr: float
    grad_var: float


class TraceApplication:
    """One application's traces, with interpolation between what was measured."""

    def __init__(self, trace_dir: Path, *, max_epochs: int | None = None,
                 max_local: int | None = None) -> None:
        self.name = trace_dir.name
        self.validation: dict[int, list[ValidationRow]] = {}
        for path in sorted(trace_dir.glob("validation-*.csv")):
            batch = int(path.stem.split("-")[-1])
            self.validation[batch] = [
                ValidationRow(float(r["progress"]), float(r["grad_sqr"]), float(r["grad_var"]))
                for r in _read(path)]
        if not self.validation:
            raise ValueError(f"traces: no validation-*.csv under {trace_dir}")
        self.batches = sorted(self.validation)
        self._placements: dict[tuple[int, ...], list[Row]] = {}
        grid: dict[tuple[int, int, float], list[tuple[float, float]]] = {}
        for r in _read(trace_dir / "placements.csv"):
            counts = tuple(int(c) for c in r["placement"])
            row = (float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"]))
            self._placements.setdefault(counts, []).append(row)
            grid.setdefault((len(counts), sum(counts), row[0]), []).append(row[1:])
        for r in _read(trace_dir / "scalability.csv"):
            key = (int(r["num_nodes"]), int(r["num_replicas"]), float(r["local_bsz"]))
            grid.setdefault(key, []).append((float(r["step_time"]), float(r["sync_time"])))
        for rows in self._placements.values():
            rows.sort()
        # (nodes -> procs -> rows by micro-batch), each point the mean of its measurements.
        self._grid: dict[int, dict[int, list[Row]]] = {}
        for (nodes, procs, bsz), vals in sorted(grid.items()):
            mean = (sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals))
            self._grid.setdefault(nodes, {}).setdefault(procs, []).append((bsz, *mean))
        local_sizes = [row[0] for rows in self._placements.values() for row in rows]
        self.base_batch = self.batches[0]
        self.limits = BatchLimits(min_local=int(min(local_sizes)),
                                  max_local=int(max_local or max(local_sizes)),
                                  max_batch=self.batches[-1])
        self.max_epochs = max_epochs or min(len(v) for v in self.validation.values())
        self.step_sync = functools.lru_cache(maxsize=None)(self._step_sync)
        self.grad_stats = functools.lru_cache(maxsize=None)(self._grad_stats)

    def progress_at(self, epoch: int) -> float:
        """Progress that completes `epoch` epochs (the least over the measured batch sizes)."""
        if epoch <= 0:
            return 0.0
        return min(rows[epoch - 1].progress for rows in self.validation.values())

    @property
    def total_progress(self) -> float:
        """Progress at which the job is done."""
        return self.progress_at(self.max_epochs)

    def _grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during `epoch` at global `batch`, linear between batches."""
        lo, hi, w = _bracket(self.batches, batch)
        a, b = self.validation[lo][epoch], self.validation[hi][epoch]
        return (a.grad_sqr + w * (b.grad_sqr - a.grad_sqr),
                a.grad_var + w * (b.grad_var - a.grad_var))

    def _step_sync(self, counts: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """Measured (step, sync) seconds for processes per node `counts` at `local_bsz`.

        A measured placement (up to rotation) is interpolated along the micro-batch.
        Others are interpolated between node counts, process counts and micro-batches of
        the per-(nodes, processes) averages, clamped to the measured range.
        """
        counts = tuple(c for c in counts if c)
        key = min(counts[i:] + counts[:i] for i in range(len(counts)))
        if key in self._placements:
            return _lerp(self._placements[key], local_bsz)
        nodes = sorted(self._grid)
        lo, hi, w = _bracket(nodes, len(counts))
        s0, c0 = self._at_nodes(lo, sum(counts), local_bsz)
        s1, c1 = self._at_nodes(hi, sum(counts), local_bsz)
        return s0 + w * (s1 - s0), c0 + w * (c1 - c0)

    def _at_nodes(self, nodes: int, procs: int, local_bsz: float) -> tuple[float, float]:
        table = self._grid[nodes]
        lo, hi, w = _bracket(sorted(table), procs)
        s0, c0 = _lerp(table[lo], local_bsz)
        s1, c1 = _lerp(table[hi], local_bsz)
        return s0 + w * (s1 - s0), c0 + w * (c1 - c0)


def load_applications(traces_dir: Path) -> dict[str, TraceApplication]:
    """Every application under `traces_dir/traces/`, with its published settings."""
    root = traces_dir / "traces"
    if not root.is_dir():
        raise ValueError(f"traces: {root} is not a folder of application traces")
    return {d.name: TraceApplication(d, **APPLICATION_SETTINGS.get(d.name, {}))
            for d in sorted(root.iterdir()) if d.is_dir()}
