"""Layouts of a model on a machine: memory per device and step time, predicted.

A layout is (pp, dp, fsdp, tp): pipeline stages, replicas, shards within a replica and
tensor-parallel ranks, placed on the device mesh in that order (tp innermost, as
`parallel.mesh` does), with a micro-batch size and activation checkpointing on or off.

Memory per device, for the stage that needs most: fp32 weights, gradients and optimizer
state of its parameters (tensor-parallel layers split over tp, everything over fsdp, but
FSDP's gradients whole while micro-batches accumulate: FSDP2 reduce-scatters them after
the last one); DDP's gradient buckets (one more copy of the gradients); under a pipeline
the rest of the model too (tandem keeps it on every stage to evaluate and export the whole
model); under FSDP the two largest units unsharded at once (prefetch); activations as the
profile measured them (bf16 halves them; tensor parallelism splits only those between a
column- and a row-parallel layer), for as many micro-batches as the schedule keeps in
flight (1F1B: min(m, pp) on the first stage), with checkpointing only each block's input
plus one block's full set; the backward's working tensors (one gradient the size of the
stage's largest saved activation); a pipeline stage's receive buffers (one per
micro-batch of the step, activations from the stage before, gradients from the one after).

Step time: the stages' forward and backward FLOPs (a backward is two forwards; a
checkpointed block runs its forward twice) at `efficiency` of the device's peak, times
(m + pp - 1) / m for the pipeline's fill and drain; the optimizer's step (its state's
traffic through memory, over the shards; Muon's orthogonalisations at the same
efficiency: whole matrices, so gathered and done on every rank under FSDP and tensor
parallelism, shared over DDP's replicas where that is faster, as Muon decides); every
collective's bytes over the link plus the machine's fixed cost per collective: gradient
all-reduce (DDP, one per 25 MiB bucket), FSDP's gathers (two per block and micro-batch:
forward, and backward after the forward freed them, as `plan.fsdp_reshard` does by
default; the root's once) and its reduce-scatter (once per unit, after the last
micro-batch; `fsdp_collectives`), hidden
behind compute up to its length where the machine's communication runs beside its
compute (GPUs), added to it where it runs on the same cores (a CPU host); tensor-parallel
all-reduces (four per block and micro-batch) and the pipeline's sends (one each way per
micro-batch) not hidden. A group within one node uses the node's link, a group across
nodes the network's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tandem.planner.machine import Machine

if TYPE_CHECKING:  # the profile imports torch; the command line does not need it to start
    from tandem.planner.profile import ModelProfile, Unit

OPTIMIZER_STATES = {"AdamW": 2, "Adam": 2, "LAMB": 2, "SGD": 1, "LARS": 1, "Muon": 1}


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    fsdp: int
    tp: int
    micro: int  # samples per micro-batch
    recompute: bool

    def describe(self) -> str:
        parts = [f"{name}{n}" for name, n in (("pp", self.pp), ("dp", self.dp),
                                               ("fsdp", self.fsdp), ("tp", self.tp)) if n > 1]
        return " x ".join(parts) or "one device"


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    memory: dict[str, float]  # bytes per device by part, for the stage that needs most
    step_s: float
    samples_per_s: float
    fits: bool
    why: str = ""
    time_parts: dict[str, float] = field(default_factory=dict)

    @property
    def total_memory(self) -> float:
        return sum(self.memory.values())


@dataclass(frozen=True)
class Setting:
    """What is fixed across layouts."""

    global_batch: int
    optimizer_states: int  # tensors of optimizer state per parameter
    bf16: bool  # activations and gathered weights in bf16
    efficiency: float  # achieved share of the peak FLOP/s
    orthogonalised: tuple[tuple[int, int], ...] = ()  # matrices Muon orthogonalises whole
    ns_steps: int = 5  # Newton-Schulz iterations per orthogonalisation


DDP_BUCKET_BYTES = 25 * 2**20


def orthogonalisation_flops(shape: tuple[int, int], steps: int) -> float:
    """FLOPs of `steps` Newton-Schulz iterations on a matrix (`optim.muon.orthogonalize`:
    x x^T, its square and the product with x, on the wide orientation)."""
    a, b = sorted(shape)
    return steps * (4.0 * a * a * b + 2.0 * a ** 3)


def stages(profile: ModelProfile, pp: int) -> list[list[Unit]]:
    """The units cut into `pp` contiguous stages, the slowest stage as fast as it can be
    (forward FLOPs; the parts before and after the blocks count)."""
    units = list(profile.units)
    if pp > len(units):
        raise ValueError(f"{pp} stages but only {len(units)} units")
    cost = [max(u.flops, 1.0) for u in units]
    prefix = [0.0]
    for c in cost:
        prefix.append(prefix[-1] + c)
    n = len(units)
    best = [[float("inf")] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                worst = max(best[k - 1][i], prefix[j] - prefix[i])
                if worst < best[k][j]:
                    best[k][j], cut[k][j] = worst, i
    bounds, j = [], n
    for k in range(pp, 0, -1):
        bounds.append((cut[k][j], j))
        j = cut[k][j]
    return [units[a:b] for a, b in reversed(bounds)]


def estimate(profile: ModelProfile, layout: Layout, machine: Machine,
             setting: Setting) -> Estimate:
    """Memory per device and step time of `layout` (see the module's docstring)."""
    replica_batch, rest = divmod(setting.global_batch, layout.dp * layout.fsdp)
    m = replica_batch // layout.micro if layout.micro else 0
    if rest or not m or replica_batch % layout.micro:
        return _refused(layout, f"global batch {setting.global_batch} does not split into "
                        f"{layout.dp * layout.fsdp} replicas of micro-batches of {layout.micro}")
    if layout.pp > 1 and m < layout.pp:
        return _refused(layout, f"{m} micro-batches a step: fewer than the {layout.pp} stages")
    cut = stages(profile, layout.pp)
    block_params = sum(u.params for u in profile.units if u.is_block) or 1
    tp_share = min(1.0, profile.tp_params / block_params) if layout.tp > 1 else 0.0
    act = 0.5 if setting.bf16 else 1.0
    local = [sum(u.params * ((1 - tp_share) + tp_share / layout.tp) if u.is_block
                 else u.params for u in stage) for stage in cut]  # parameters per device
    whole = sum(local)
    worst: dict[str, float] = {}
    for k, stage in enumerate(cut):
        state = local[k] * 4.0 / layout.fsdp
        accumulating = layout.fsdp > 1 and (m > 1 or layout.pp > 1)
        memory = {"weights": state, "gradients": local[k] * 4.0 if accumulating else state,
                  "optimizer": state * setting.optimizer_states}
        if layout.pp == 1 and layout.tp == 1 and layout.fsdp == 1 and layout.dp > 1:
            memory["ddp buckets"] = state
        if layout.pp > 1:  # a plain copy of the whole model (a stage's own are shared)
            memory["whole model"] = (whole - (0 if layout.fsdp > 1 else local[k])) * 4.0
        if layout.fsdp > 1:
            largest = sorted((u.params for u in stage), reverse=True)[:2]
            memory["gathered"] = sum(largest) * (2.0 if setting.bf16 else 4.0)
        in_flight = min(m, layout.pp - k) if layout.pp > 1 else 1
        memory["activations"] = in_flight * layout.micro * act * _saved(stage, profile,
                                                                       layout)
        memory["backward working"] = layout.micro * act * max(
            max(u.largest_bytes, u.tp_largest_bytes / layout.tp) for u in stage)
        if layout.pp > 1:
            neighbours = (k > 0) + (k < len(cut) - 1)
            memory["pipeline buffers"] = (neighbours * m * layout.micro * act
                                          * profile.boundary_bytes)
        if sum(memory.values()) > sum(worst.values()):
            worst = memory
    times = _times(profile, cut, local, layout, machine, setting, m)
    step = sum(times.values())
    fits = sum(worst.values()) <= machine.memory
    why = "" if fits else (f"needs {sum(worst.values()) / 2**30:.1f} GiB per device, "
                           f"{machine.memory / 2**30:.1f} GiB available")
    return Estimate(layout, worst, step, setting.global_batch / step, fits, why, times)


def _saved(stage: list[Unit], profile: ModelProfile, layout: Layout) -> float:
    """Bytes saved for the backward per sample of one micro-batch on this stage (fp32)."""
    def kept(u: Unit) -> float:
        return u.saved_bytes - u.tp_saved_bytes + u.tp_saved_bytes / layout.tp

    blocks = [u for u in stage if u.is_block]
    other = sum(kept(u) for u in stage if not u.is_block)
    if layout.recompute and blocks:
        return other + len(blocks) * profile.boundary_bytes + max(kept(u) for u in blocks)
    return other + sum(kept(u) for u in blocks)


def _times(profile: ModelProfile, cut: list[list[Unit]], local: list[float],
           layout: Layout, machine: Machine, setting: Setting, m: int) -> dict[str, float]:
    rate = machine.peak * setting.efficiency
    replica_batch = layout.micro * m
    largest = max(range(len(cut)), key=lambda k: local[k])
    params, share = local[largest], local[largest] / sum(local)

    def seconds(stage: list[Unit]) -> float:
        flops = sum(u.flops * (4 if layout.recompute and u.is_block else 3) for u in stage)
        return flops * replica_batch / layout.tp / rate

    compute = max(seconds(s) for s in cut) * (m + layout.pp - 1) / m
    act_bytes = (2.0 if setting.bf16 else 4.0) / 4.0  # profile bytes are fp32
    times = {"compute": compute,
             "optimizer": _optimizer_seconds(params, share, layout, machine, setting)}
    shard_link = _link(machine, layout.tp * layout.fsdp)
    replica_link = _link(machine, layout.tp * layout.fsdp * layout.dp)
    comm = 0.0
    collectives = 0
    if layout.fsdp > 1:  # gathered for each micro-batch's forward and again for its backward
        f = (layout.fsdp - 1) / layout.fsdp
        stage = cut[largest]
        root = sum(u.params for u in stage if not u.is_block)  # gathered once a micro-batch
        gathered = m * (2 * (params - root) + root) * (2.0 if setting.bf16 else 4.0) * f
        comm += (gathered + params * 4.0 * f) / shard_link
        collectives += fsdp_collectives(sum(1 for u in stage if u.is_block and u.params),
                                        root > 0, m)
    if layout.dp > 1:
        comm += 2 * (layout.dp - 1) / layout.dp * params / layout.fsdp * 4.0 / replica_link
        collectives += max(1, -(-int(params / layout.fsdp * 4.0) // DDP_BUCKET_BYTES))
    comm += collectives * machine.collective_s
    times["data-parallel (exposed)"] = (max(0.0, comm - compute) if machine.overlaps
                                        else comm)
    if layout.tp > 1:
        blocks = max(sum(1 for u in s if u.is_block) for s in cut)
        volume = layout.micro * profile.boundary_bytes * act_bytes
        times["tensor-parallel"] = tp_collectives(blocks, m) * (
            2 * (layout.tp - 1) / layout.tp * volume / _link(machine, layout.tp)
            + machine.collective_s)
    if layout.pp > 1:
        volume = layout.micro * profile.boundary_bytes * act_bytes
        times["pipeline sends"] = 2 * m * (volume / _link(machine, machine.devices)
                                           + machine.collective_s)
    return times


def fsdp_collectives(blocks: int, root: bool, m: int) -> int:
    """Collectives FSDP2 runs in a step of `m` micro-batches: each block's unit gathered
    for each micro-batch's forward and again for its backward, the root's (the parts
    outside the blocks) once per micro-batch (FSDP2 keeps the root gathered from its
    forward to its backward), one reduce-scatter per unit after the last micro-batch."""
    return blocks * (2 * m + 1) + root * (m + 1)


def tp_collectives(blocks: int, m: int) -> int:
    """All-reduces tensor parallelism runs in a step: per block and micro-batch, after
    each row-parallel layer's forward and before each column-parallel layer's input
    gradient (attention and MLP: two pairs)."""
    return 4 * blocks * m


def _optimizer_seconds(params: float, share: float, layout: Layout, machine: Machine,
                       setting: Setting) -> float:
    """The optimizer's step on one device: `params` (this stage's, per tensor-parallel
    rank) stepped elementwise over the FSDP shards, reading the weight, its gradient and
    state and writing the weight and state; Muon's orthogonalisations of this stage's
    `share` of the matrices (see the module docstring)."""
    per_param = (3 + 2 * setting.optimizer_states) * 4.0
    seconds = params / layout.fsdp * per_param / machine.memory_bw
    if not setting.orthogonalised:
        return seconds
    rate = machine.peak * setting.efficiency
    whole = share * sum(orthogonalisation_flops(s, setting.ns_steps)
                        for s in setting.orthogonalised) / rate
    matrices = share * len(setting.orthogonalised)
    matrix_bytes = share * sum(a * b for a, b in setting.orthogonalised) * 4.0
    shards = layout.fsdp * layout.tp
    if shards > 1:  # each matrix gathered whole, orthogonalised on every rank
        gather = ((shards - 1) / shards * matrix_bytes / _link(machine, shards)
                  + matrices * machine.collective_s)
        return seconds + whole + gather
    if layout.dp > 1:  # shared over the replicas, handed out by one all-gather, if faster
        shared = (whole / layout.dp + machine.collective_s + (layout.dp - 1) / layout.dp
                  * matrix_bytes / _link(machine, layout.dp))
        return seconds + min(whole, shared)
    return seconds + whole


def _link(machine: Machine, span: int) -> float:
    """Bytes/s of a group spanning `span` consecutive devices."""
    return machine.intra if span <= machine.per_node else machine.inter


def _refused(layout: Layout, why: str) -> Estimate:
    return Estimate(layout, {}, float("inf"), 0.0, False, why)


def layouts(devices: int, per_node: int, units: int) -> list[tuple[int, int, int, int]]:
    """Every (pp, dp, fsdp, tp) whose product is `devices`, tp within a node, pp at most
    the number of units."""
    out = []
    for tp in _divisors(devices):
        if tp > per_node:
            continue
        for pp in _divisors(devices // tp):
            if pp > units:
                continue
            data = devices // (tp * pp)
            for fsdp in _divisors(data):
                out.append((pp, data // fsdp, fsdp, tp))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(profile: ModelProfile, machine: Machine, setting: Setting) -> list[Estimate]:
    """For each layout, its fastest micro-batch and checkpointing choice that fits (or,
    when none fits, the one needing least memory); fitting ones first, fastest first."""
    out = []
    for pp, dp, fsdp, tp in layouts(machine.devices, machine.per_node, len(profile.units)):
        replica_batch = setting.global_batch // (dp * fsdp) if setting.global_batch % (
            dp * fsdp) == 0 else 0
        micros = [b for b in _divisors(replica_batch) if b <= replica_batch] or [1]
        tried = [estimate(profile, Layout(pp, dp, fsdp, tp, micro, recompute), machine,
                          setting) for micro in micros for recompute in (False, True)]
        fitting = [e for e in tried if e.fits]
        if fitting:
            # Equal times: the larger micro-batch (fewer passes), without recomputation.
            out.append(min(fitting, key=lambda e: (e.step_s, -e.layout.micro,
                                                   e.layout.recompute)))
        else:
            sized = [e for e in tried if e.memory]
            out.append(min(sized, key=lambda e: e.total_memory) if sized else tried[0])
    return sorted(out, key=lambda e: (not e.fits, e.step_s))
