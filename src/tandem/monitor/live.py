"""The live monitor: per-step figures on the device, one gather per logging window.

Each step leaves its loss and gradient norm in device tensors (no synchronisation).
When a logging window closes, every rank packs its figures into one fixed-size vector
and a single all_gather brings them to rank 0, which derives the job's figures,
per-rank skew (straggler scores), runs the health detectors and hands rows to the
sinks. That gather replaces the loss all-reduce a plain loop would do anyway.
"""

from __future__ import annotations

import math
import statistics
import sys
from dataclasses import dataclass, field

import psutil
import torch

from tandem.monitor import commsplit
from tandem.monitor.catalogue import (
    FLOPS_ACHIEVED,
    FLOPS_PEAK,
    FLOPS_PER_RANK_STEP,
    GNS_BIG_GRAD_SQ,
    GNS_SMALL_GRAD_SQ,
    GRAD_NOISE_SCALE,
    GRAD_NORM,
    LOSS,
    MEM_CUDA_PEAK,
    MEM_CUDA_TOTAL,
    MFU,
    SAMPLES_PER_S,
    TIME_COMPUTE,
    TIME_PREFIX,
    TIME_STEP,
    TIME_STEP_MAX,
    TIME_STEP_P50,
    TOKENS_PER_S,
    UPDATE_RATIO,
    phase_metric,
)
from tandem.monitor.detect import Event, HealthDetectors
from tandem.monitor.noise import NoiseScale
from tandem.monitor.phases import PHASES, PhaseClock
from tandem.monitor.system import SystemSampler
from tandem.monitor.window import Row, gather, rank_rows

UPDATE_SAMPLE_BYTES = 32 * 2**20  # most weight bytes copied to measure the update ratio
_FIXED = ("loss_sum", "steps", "busy", "samples", "update_sq", "weight_sq", "small_grad_sq",
          "big_grad_sq", "b_small", "b_big", *PHASES, "rss", "cuda_peak", "cuda_total")


@dataclass
class Window:
    """What rank 0 learned from one logging window."""

    step: int
    loss: float
    samples_per_s: float
    rows: list[Row] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    step_s: float = 0.0  # the job's seconds per step in this window


def local(tensor: torch.Tensor) -> torch.Tensor:
    """The part of `tensor` this rank holds (a DTensor's local shard)."""
    # Looked up, not imported: importing DTensor is a large part of start-up, and
    # a tensor can only be a DTensor once a plan that shards (FSDP, TP) has imported it.
    dtensor = sys.modules.get("torch.distributed.tensor")
    return tensor.to_local() if dtensor and isinstance(tensor, dtensor.DTensor) else tensor


class LiveMonitor:
    """Collects step figures on every rank and turns them into windows on rank 0."""

    def __init__(self, *, device: torch.device, rank: int, world_size: int, log_every: int,
                 tokens_per_sample: int | None, timing: bool = True,
                 sharded: bool = False, measures_comm: bool = True,
                 free_running: bool = False) -> None:
        self.device, self.rank, self.world = device, rank, world_size
        self.log_every = log_every
        # Workers at their own pace (async): each takes its own number of local steps, each
        # on one share of a global batch; a window holds at most all its shares.
        self.free_running = free_running
        self.capacity = log_every * (world_size if free_running else 1)
        self.sharded = sharded  # each rank holds a part of the weights (FSDP)
        # The plan times its communication on the critical path (else: not known).
        self.measures_comm = measures_comm and timing
        self._samples = 0  # global samples of the open window (the same on every rank)
        self._update: tuple[torch.Tensor, torch.Tensor] | None = None  # (|dw|^2, |w|^2)
        self._sample: list[int] | None = None  # indices of the parameters measured
        # (|g_local|^2, |g|^2, B_small, B_big) of the window's measured step, for B_noise
        self._noise_in: tuple[torch.Tensor, torch.Tensor, int, int] | None = None
        self.noise = NoiseScale()
        self.tokens_per_sample = tokens_per_sample
        self.clock = PhaseClock(device, enabled=timing)
        self.detectors = HealthDetectors()
        self.system = SystemSampler(device) if rank == 0 else None
        self.static: dict[str, float] = {}  # calibration results, added to every window
        self._losses: list[torch.Tensor] = []
        self._norms: list[torch.Tensor] = []
        self._times: list[float] = []
        self.step_times: list[float] = []  # every step of this attempt, for percentiles
        self._process = psutil.Process()

    def step(self, loss: torch.Tensor, grad_norm: torch.Tensor, seconds: float,
             samples: int) -> None:
        """Keep one step's mean loss over this rank's micro-batches, the gradient norm, the
        host time and the step's global batch (no sync).

        On CUDA the host time of a step is its launch time until something synchronises;
        the percentiles are exact on CPU and indicative on GPU.
        """
        self._losses.append(loss.detach().float())
        self._norms.append(grad_norm.detach().float())
        self._times.append(seconds)
        self._samples += samples

    def wants_update_ratio(self, step: int) -> bool:
        """Whether optimizer step `step` (0-based) closes a window: its update is measured."""
        return (step + 1) % self.log_every == 0

    def _measured(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """The parameters the update ratio is measured on: all of them when this rank's
        part fits UPDATE_SAMPLE_BYTES, else every k-th tensor (the same ones on every
        rank and at every window), so the copy never costs a model's worth of memory."""
        if self._sample is None:
            sizes = [local(p).numel() * local(p).element_size() for p in params]
            stride = max(1, math.ceil(sum(sizes) / UPDATE_SAMPLE_BYTES))
            self._sample = list(range(0, len(params), stride))
        return [local(params[i]).detach() for i in self._sample]

    def snapshot(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """A copy of (a sample of) this rank's weights before an update, once per window."""
        return [p.clone() for p in self._measured(params)]

    def update_sizes(self, before: list[torch.Tensor], params: list[torch.Tensor]) -> None:
        """Keep |w_after - w_before|^2 and |w_before|^2 over the sample (no sync, no copy)."""
        if not before:
            return
        weight = torch.stack(torch._foreach_norm(before)).double().square().sum()
        torch._foreach_sub_(before, self._measured(params))  # in place: w_before - w_after
        upd = torch.stack(torch._foreach_norm(before)).double().square().sum()
        self._update = (upd, weight)

    def gradient_sizes(self, local_sq: torch.Tensor, global_sq: torch.Tensor, b_small: int,
                       b_big: int) -> None:
        """Keep one step's |g_local|^2 (this rank's B_small samples, before the all-reduce)
        and |g|^2 (all B_big samples) for the gradient noise scale (no sync)."""
        self._noise_in = (local_sq.detach().double(), global_sq.detach().double(), b_small,
                          b_big)

    def percentiles(self) -> dict[str, float]:
        """p50 and p95 of this rank's step times so far (host clock)."""
        if not self.step_times:
            return {}
        ordered = sorted(self.step_times)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

        return {"step_time_p50_s": at(0.5), "step_time_p95_s": at(0.95)}

    def _pack(self, busy: float) -> torch.Tensor:
        """This rank's window as one vector of fixed size 2 x capacity + len(_FIXED)."""
        n = len(self._losses)
        pad = self.capacity - n
        nan = [torch.full((pad,), math.nan, device=self.device)]
        losses = torch.cat([torch.stack(self._losses), *nan] if n else nan)
        norms = torch.cat([torch.stack(self._norms), *nan] if n else nan)
        phases = self.clock.collect()
        fixed = [0.0, float(n), busy, float(self._samples), math.nan, math.nan, math.nan,
                 math.nan, 0.0, 0.0, *(phases[p] for p in PHASES),
                 float(self._process.memory_info().rss), *self._cuda_memory()]
        head = torch.tensor(fixed, dtype=torch.float64, device=self.device)
        head[0] = losses[:n].sum()
        if self._update is not None:
            head[4], head[5] = self._update
            self._update = None
        if self._noise_in is not None:
            head[6], head[7] = self._noise_in[0], self._noise_in[1]
            head[8], head[9] = float(self._noise_in[2]), float(self._noise_in[3])
            self._noise_in = None
        return torch.cat([head, losses.double(), norms.double()])

    def close(self, step: int, busy: float,
              extra: dict[str, float | list[float]]) -> Window | None:
        """End a window: gather from all ranks; rank 0 gets the Window (`extra`: job-wide
        values, or a list of one value per rank). All ranks."""
        # A free-running worker may have taken no step in a window the others filled.
        if not self._losses and not self.free_running:
            return None
        table = gather(self._pack(busy))
        self._losses.clear()
        self._norms.clear()
        self._samples = 0
        times, self._times = self._times, []
        self.step_times += times
        if self.rank != 0:
            return None
        window = self._derive(step, table, extra)
        ordered = sorted(times)
        if ordered:
            window.rows += [(step, -1, TIME_STEP_P50, ordered[len(ordered) // 2]),
                            (step, -1, TIME_STEP_MAX, ordered[-1])]
        return window

    def _cuda_memory(self) -> tuple[float, float]:
        """(peak bytes allocated since the last window, the device's bytes); 0s off CUDA."""
        if self.device.type != "cuda":
            return 0.0, 0.0
        peak = float(torch.cuda.max_memory_allocated(self.device))
        torch.cuda.reset_peak_memory_stats(self.device)
        return peak, float(torch.cuda.get_device_properties(self.device).total_memory)

    def _derive(self, step: int, table: torch.Tensor,
                extra: dict[str, float | list[float]]) -> Window:
        # A list holds one value per rank: rows of each rank, and their mean as the job's.
        per_rank = {name: v for name, v in extra.items() if isinstance(v, list)}
        extra = {name: statistics.fmean(v) if isinstance(v, list) else v
                 for name, v in extra.items()}
        k = len(_FIXED)
        fixed = {name: table[:, i].tolist() for i, name in enumerate(_FIXED)}
        steps = int(fixed["steps"][0])
        grad_norms = table[0, k + self.capacity:k + self.capacity + steps].tolist()
        loss = sum(fixed["loss_sum"]) / max(1.0, sum(fixed["steps"]))
        busy = max(fixed["busy"])
        if self.free_running:  # rank 0's own steps; per step: a worker's local step
            per_step_loss = table[0, k:k + steps].tolist()
            counts = [max(1.0, c) for c in fixed["steps"]]
            steps = statistics.fmean(counts)  # type: ignore[assignment]
            samples = sum(fixed["samples"])
        else:
            per_step_loss = (table[:, k:k + steps].sum(0) / self.world).tolist()
            counts, samples = [float(steps)] * self.world, fixed["samples"][0]
        rate = samples / busy if busy > 0 else 0.0
        rows: list[Row] = [(step, -1, LOSS, loss), (step, -1, SAMPLES_PER_S, rate),
                           (step, -1, TIME_STEP, busy / steps)]
        if self.tokens_per_sample:
            rows.append((step, -1, TOKENS_PER_S, rate * self.tokens_per_sample))
        finite = [g for g in grad_norms if math.isfinite(g)]
        if finite:
            rows.append((step, -1, GRAD_NORM, statistics.fmean(finite)))
        rows += self._per_rank(step, fixed, counts)
        update, weight = fixed["update_sq"], fixed["weight_sq"]
        if math.isfinite(update[0]) and math.isfinite(weight[0]):
            # Sharded weights: each rank holds a part, so the parts add up; replicas hold
            # the same weights, so rank 0's figure is everyone's.
            u, w = (sum(update), sum(weight)) if self.sharded else (update[0], weight[0])
            if w > 0:
                rows.append((step, -1, UPDATE_RATIO, math.sqrt(u / w)))
        rows += self._noise_rows(step, fixed)
        phases = {p: statistics.fmean(fixed[p]) / steps for p in PHASES}
        # Backward's wait for the all-reduce is not compute.
        phases["compute"] = max(0.0, phases["forward"] + phases["backward"]
                                - phases["comm_tail"])
        if self.world == 1:  # nothing crosses a process boundary
            phases |= {"comm_exposed": 0.0, "sync_wait": 0.0}
        elif self.measures_comm:
            exposed = [(t + c) / steps for t, c in zip(fixed["comm_tail"], fixed["comm"],
                                                       strict=True)]
            phases |= {k.removeprefix(TIME_PREFIX): v for k, v in commsplit.rows(
                exposed, {**self.static, **extra}, self.world).items()}
        rows += [(step, -1, phase_metric(phase), value) for phase, value in phases.items()]
        flops, peak = self.static.get(FLOPS_PER_RANK_STEP), self.static.get(FLOPS_PEAK)
        if flops and peak and busy > 0:
            achieved = flops * steps / busy
            rows += [(step, -1, FLOPS_ACHIEVED, achieved),
                     (step, -1, MFU, achieved / peak)]
        system = self.system.sample() if self.system else {}
        rows += [(step, -1, name, value) for name, value in {**self.static, **extra,
                                                               **system}.items()]
        rows += [(step, r, name, value) for name, values in per_rank.items()
                 for r, value in enumerate(values)]
        events = self._detect(step, per_step_loss, grad_norms, rate,
                              statistics.fmean(fixed["data"]) / max(busy, 1e-12))
        return Window(step=step, loss=loss, samples_per_s=rate, rows=rows, events=events,
                      step_s=busy / steps)

    def _noise_rows(self, step: int, fixed: dict[str, list[float]]) -> list[Row]:
        """The gradient noise scale, updated with the window's measured step."""
        small = [v for v in fixed["small_grad_sq"] if math.isfinite(v)]
        if len(small) != self.world or not math.isfinite(fixed["big_grad_sq"][0]):
            return []
        small_sq, big_sq = statistics.fmean(small), fixed["big_grad_sq"][0]
        self.noise.update(small_sq, big_sq, int(fixed["b_small"][0]), int(fixed["b_big"][0]))
        rows: list[Row] = [(step, -1, GNS_SMALL_GRAD_SQ, small_sq),
                           (step, -1, GNS_BIG_GRAD_SQ, big_sq)]
        value = self.noise.value()
        return rows + ([] if value is None else [(step, -1, GRAD_NOISE_SCALE, value)])

    def _per_rank(self, step: int, fixed: dict[str, list[float]],
                  counts: list[float]) -> list[Row]:
        """Each rank's step, memory, straggler score (its wait: backward) and phases
        (`counts`: each rank's steps in the window)."""
        ranks = range(self.world)
        rows = rank_rows(step, ranks, [b / n for b, n in zip(fixed["busy"], counts, strict=True)],
                         [bw / n for bw, n in zip(fixed["backward"], counts, strict=True)],
                         fixed["rss"])
        for r in ranks:
            steps = counts[r]
            rows.append((step, r, TIME_COMPUTE,
                         (fixed["forward"][r] + fixed["backward"][r]
                          - fixed["comm_tail"][r]) / steps))
            if fixed["cuda_total"][r] > 0:
                rows += [(step, r, MEM_CUDA_PEAK, fixed["cuda_peak"][r]),
                         (step, r, MEM_CUDA_TOTAL, fixed["cuda_total"][r])]
            rows += [(step, r, phase_metric(p), fixed[p][r] / steps) for p in PHASES]
        return rows

    def _detect(self, step: int, losses: list[float], norms: list[float], rate: float,
                data_fraction: float) -> list[Event]:
        events: list[Event] = []
        first = step - len(losses)  # events name the step by its 0-based index
        for i, (loss, norm) in enumerate(zip(losses, norms, strict=True)):
            events += self.detectors.step(first + i, loss, norm)
        events += self.detectors.window(step, rate, data_fraction)
        return events

