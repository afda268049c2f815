"""Step-time model of data-parallel training: fit from measurements, predict at other sizes.

The model (the form Pollux uses, with compute and synchronisation kept apart):

    compute(b)   = compute_const + compute_per_sample * b      one micro-batch of b samples
    sync(n, r)   = 0                                             r == 1
                 = intra_const + intra_per_proc * (r - 2)        r > 1 on one node
                 = inter_const + inter_per_proc * (r - 2)        r > 1 over n > 1 nodes
    step(n, r, b, k) = (k + 1) * compute(b) + sync(n, r)         k accumulation micro-batches

`sync` is the exposed synchronisation time per optimizer step (the traces' `sync_time`;
tandem's exposed-communication phase). Every term is linear in the parameters, so the fit
is a non-negative least-squares problem on relative errors, solved exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Crossing nodes costs at least what staying inside one costs: the prior for an unmeasured
# link is the measured one scaled by this factor (and its inverse the other way round).
INTER_OVER_INTRA = 1.1


@dataclass(frozen=True)
class StepSample:
    """One measurement: `procs` processes on `nodes` nodes, `local_bsz` samples each."""

    nodes: int
    procs: int
    local_bsz: float
    step_time: float
    """Seconds per optimizer step without accumulation."""
    sync_time: float | None = None
    """Exposed synchronisation seconds of that step; None when not measured apart."""


@dataclass(frozen=True, kw_only=True)
class ThroughputModel:
    """Predicts the seconds of one optimizer step at any size, placement and micro-batch."""

    compute_const: float
    compute_per_sample: float
    intra_const: float = 0.0
    intra_per_proc: float = 0.0
    inter_const: float = 0.0
    inter_per_proc: float = 0.0

    def compute_time(self, local_bsz: float) -> float:
        """Seconds of forward and backward of one micro-batch of `local_bsz` samples."""
        return self.compute_const + self.compute_per_sample * local_bsz

    def sync_time(self, nodes: int, procs: int) -> float:
        """Exposed synchronisation seconds per optimizer step."""
        if procs <= 1:
            return 0.0
        if nodes <= 1:
            return self.intra_const + self.intra_per_proc * (procs - 2)
        return self.inter_const + self.inter_per_proc * (procs - 2)

    def step_time(self, nodes: int, procs: int, local_bsz: float, accum_steps: int = 0) -> float:
        """Seconds per optimizer step with `accum_steps` extra accumulated micro-batches."""
        return (accum_steps + 1) * self.compute_time(local_bsz) + self.sync_time(nodes, procs)

    def samples_per_s(self, nodes: int, procs: int, local_bsz: float,
                      accum_steps: int = 0) -> float:
        """Training samples per second of the whole job."""
        batch = procs * local_bsz * (accum_steps + 1)
        return batch / self.step_time(nodes, procs, local_bsz, accum_steps)

    @classmethod
    def fit(cls, samples: Sequence[StepSample]) -> ThroughputModel:
        """Fit the model to measurements; unmeasured links get the priors described above.

        With a single micro-batch size the constant and per-sample compute terms cannot
        be told apart: they are split evenly. A link measured at one process count only
        gets no per-process growth. A link never measured is assumed free when neither
        is measured: the policy then tries the job larger (boundedly) to learn it.
        """
        if not samples:
            raise ValueError("samples: empty; the throughput model needs >= 1 measurement")
        for s in samples:
            if s.step_time <= 0 or s.procs < 1 or s.nodes < 1 or s.local_bsz <= 0:
                raise ValueError(f"samples: {s} is not a valid measurement (need positive "
                                 "step_time, local_bsz, procs and nodes)")
        columns, rows, values = _design(samples)
        solution = _nnls(np.array(rows), np.array(values))
        params = dict(zip(columns, solution, strict=True))
        return cls(**_expand(params, samples))


def _design(samples: Sequence[StepSample]) -> tuple[list[str], list[list[float]], list[float]]:
    """Rows of the relative-error least-squares problem and the names of its unknowns."""
    sizes = {s.local_bsz for s in samples}
    intra_r = {s.procs for s in samples if s.procs > 1 and s.nodes == 1}
    inter_r = {s.procs for s in samples if s.procs > 1 and s.nodes > 1}
    columns = ["compute_const", "compute_per_sample"] if len(sizes) > 1 else ["compute_tied"]
    if intra_r:
        columns += ["intra_const"] + (["intra_per_proc"] if len(intra_r) > 1 else [])
    if inter_r:
        columns += ["inter_const"] + (["inter_per_proc"] if len(inter_r) > 1 else [])
    ref = next(iter(sizes))

    def compute_row(b: float) -> dict[str, float]:
        if len(sizes) > 1:
            return {"compute_const": 1.0, "compute_per_sample": b}
        return {"compute_tied": 0.5 + 0.5 * b / ref}

    def sync_row(s: StepSample) -> dict[str, float]:
        if s.procs <= 1:
            return {}
        link = "intra" if s.nodes == 1 else "inter"
        return {f"{link}_const": 1.0, f"{link}_per_proc": float(s.procs - 2)}

    rows, values = [], []
    for s in samples:
        equations = []
        if s.sync_time is None:
            equations.append(({**compute_row(s.local_bsz), **sync_row(s)}, s.step_time))
        else:
            equations.append((compute_row(s.local_bsz), s.step_time - s.sync_time))
            if s.procs > 1:
                equations.append((sync_row(s), max(s.sync_time, 1e-9)))
        for terms, value in equations:
            scale = 1.0 / max(value, 1e-9)  # relative error: every point counts alike
            rows.append([terms.get(c, 0.0) * scale for c in columns])
            values.append(value * scale)
    return columns, rows, values


def _expand(params: dict[str, float], samples: Sequence[StepSample]) -> dict[str, float]:
    """Model parameters from the fitted unknowns, with the priors for unmeasured terms."""
    out = {k: float(v) for k, v in params.items() if k != "compute_tied"}
    if "compute_tied" in params:
        b = samples[0].local_bsz
        out["compute_const"] = params["compute_tied"] / 2
        out["compute_per_sample"] = params["compute_tied"] / (2 * b)
    has_intra = "intra_const" in params
    has_inter = "inter_const" in params
    if has_intra and not has_inter:
        out["inter_const"] = out["intra_const"] * INTER_OVER_INTRA
        out["inter_per_proc"] = out.get("intra_per_proc", 0.0) * INTER_OVER_INTRA
    if has_inter and not has_intra:
        out["intra_const"] = out["inter_const"] / INTER_OVER_INTRA
        out["intra_per_proc"] = out.get("inter_per_proc", 0.0) / INTER_OVER_INTRA
    return out


def _nnls(a: np.ndarray, y: np.ndarray, iterations: int = 100) -> np.ndarray:
    """Non-negative least squares, min |a x - y| with x >= 0 (Lawson and Hanson's active set)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max()))
    for _ in range(iterations):
        w = a.T @ (y - a @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            bad = passive & (z <= 0)
            gap = x[bad] - z[bad]
            alpha = float(np.min(np.where(gap > 0, x[bad] / np.where(gap > 0, gap, 1.0), 0.0)))
            x = x + alpha * (z - x)
            passive &= x > tol
    return x
