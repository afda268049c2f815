"""What the tuner may try: candidates sized from measurements, and what it must not try.

A candidate is a set of config changes over the current plan, with the measurement
that motivates it and, where the measurement allows, the speed-up it predicts. The
sizes come from the job's own figures (`sizing.py`: memory for the micro-batch, the
link's latency x bandwidth for the bucket, data time and free cores for loader workers,
cores for threads, measured costs for the logging, evaluation and checkpoint cadence),
never from fixed multiples. The diagnosis adds the families whose remedies change the
numerics (gradient compression, local SGD; on GPUs precision, sharding, recomputation),
each tried only after its control experiment (`controls.py`) showed the cause is real.

Only keys present in tandem.config at run time are proposed, and never a combination
the config or the strategy would refuse (`check`): DDP's static graph does not combine
with gradient accumulation (its reducer asserts), for instance. Changes that alter the
numerics (compression, precision, batch split, local SGD, optimizer settings) are lossy:
they must also pass the convergence guardrail (`guard.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tandem.config import Config, _field_types, _set, sections, validate
from tandem.parallel import registry as strategies

DATA_CONTROL = "data"
COMM_CONTROL = "comm"
# Keys whose change alters the training numerics (prefix match on the section for optim).
LOSSY_KEYS = frozenset({
    "plan.comm_hook", "plan.strategy", "plan.sync_every", "plan.outer_lr",
    "plan.outer_momentum", "plan.powersgd_rank", "plan.topk_ratio", "precision.mode",
    "plan.fsdp_param_dtype", "plan.fsdp_reduce_dtype", "train.micro_batch",
    "train.global_batch", "train.batch_ramp",
})
# plan.strategy values that keep DDP's math (FSDP is tested equal to DDP).
EXACT_STRATEGIES = frozenset(strategies.names("exact"))
HOOKED_STRATEGIES = strategies.names("takes_comm_hook")  # DDP and auto


@dataclass(frozen=True)
class Candidate:
    """Config changes to try over the current plan, why, and what they should gain."""

    changes: dict[str, Any]
    family: str  # batch, threads, cadence, data, comm, memory, compute, mixing, user
    reason: str
    control: str = ""  # non-empty: a bound, never adopted
    predicted: float | None = None  # predicted speed-up from the measurements, if any
    figure: str = "wall"  # what its runs are judged by (mixing: time to the tasks' targets)

    @property
    def label(self) -> str:
        """'data.workers=2, data.prefetch=4' (or 'control: data')."""
        if self.control:
            return f"control:{self.control}"
        return ", ".join(f"{k}={v}" for k, v in self.changes.items()) or "baseline"

    @property
    def lossy(self) -> bool:
        """Whether the change alters the training numerics (guardrail needed)."""
        for key, value in self.changes.items():
            if key.startswith("optim."):
                return True
            if key == "plan.strategy" and value in EXACT_STRATEGIES:
                continue
            if key in LOSSY_KEYS:
                return True
        return False


def known_keys() -> set[str]:
    """Every section.field the config tree has now."""
    return {f"{s}.{name}" for s, kind in sections().items() for name in _field_types(kind)}


def flatten(config: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """{'data': {'workers': 0}} -> {'data.workers': 0}."""
    return {f"{s}.{k}": v for s, values in config.items() if isinstance(values, Mapping)
            for k, v in values.items()}


def accumulation(config: Mapping[str, Any], world: int) -> int | None:
    """Accumulation passes per step of a flat config on `world` processes (None: invalid)."""
    model_parallel = max(1, int(config.get("plan.tp", 1) or 1)) * max(
        1, int(config.get("plan.pp", 1) or 1))
    dp = max(1, world // model_parallel)
    batch = int(config.get("train.global_batch", 0) or 0)
    micro = int(config.get("train.micro_batch", 0) or 0)
    if batch <= 0 or batch % dp:
        return None
    per_rank = batch // dp
    micro = micro or per_rank
    if micro > per_rank or per_rank % micro:
        return None
    return per_rank // micro


def check(base: Mapping[str, Any], changes: Mapping[str, Any], world: int = 1) -> str | None:
    """Why `changes` over the flat config `base` is not a valid config on `world`
    processes (None: it is)."""
    config = Config()
    keys = known_keys()
    merged = {**base, **changes}
    try:
        for key, value in merged.items():
            if key in keys:
                _set(config, key, value)
        validate(config)
    except ValueError as err:
        return str(err)
    accum = accumulation(merged, world)
    if accum is None:
        return (f"train.micro_batch {merged.get('train.micro_batch')} does not divide the "
                f"per-rank batch of train.global_batch {merged.get('train.global_batch')} "
                f"on {world} process(es)")
    if merged.get("plan.static_graph") and (accum > 1 or merged.get("train.batch_ramp")):
        return ("plan.static_graph needs every step to run backward once: with "
                f"{accum} accumulation passes (or a batch ramp) DDP's reducer fails")
    return None


def _ddp(base: Mapping[str, Any], world: int) -> bool:
    return (world > 1 and str(base.get("plan.strategy", strategies.AUTO.name)) in HOOKED_STRATEGIES
            and int(base.get("plan.tp", 1) or 1) == 1)


def _have(*keys: str) -> bool:
    present = known_keys()
    return all(k in present for k in keys)


def comm_remedies(base: Mapping[str, Any], reason: str, world: int,
                  predicted: float | None) -> list[Candidate]:
    """Lossy communication remedies for a communication-bound DDP job (after its control)."""
    if not _ddp(base, world):
        return []
    out = []
    if base.get("plan.comm_hook", "none") == "none":
        out += [Candidate({"plan.comm_hook": "fp16"}, "comm", reason, predicted=predicted),
                Candidate({"plan.comm_hook": "powersgd"}, "comm", reason,
                          predicted=predicted)]
    # Meeting every sync_every steps; streaming DiLoCo also hides the meetings behind
    # inner steps (the time-to-target rule decides whether either pays).
    out += [Candidate({"plan.strategy": name, "plan.comm_hook": "none"}, "comm", reason,
                      predicted=predicted)
            for name in (strategies.LOCALSGD.name, strategies.STREAMING_DILOCO.name)]
    if not base.get("plan.static_graph") and accumulation(base, world) == 1:
        out.append(Candidate({"plan.static_graph": True}, "comm", reason))
    return out


def memory_remedies(base: Mapping[str, Any], reason: str, world: int) -> list[Candidate]:
    """Remedies for a device whose memory is nearly full (GPU: memory-bound finding)."""
    out = []
    if _have("plan.activation_checkpointing") and not base.get("plan.activation_checkpointing"):
        out.append(Candidate({"plan.activation_checkpointing": True}, "memory", reason))
    if world > 1 and str(base.get("plan.strategy", strategies.AUTO.name)) in HOOKED_STRATEGIES:
        out.append(Candidate({"plan.strategy": strategies.FSDP.name, "plan.comm_hook": "none"},
                             "memory", reason))
    return out


def pipeline_remedies(finding: Any, reason: str) -> list[Candidate]:
    """The plans the pipeline-bubble finding priced by replaying its schedule (more
    micro-batches, an interleaved schedule): they keep the math, so no guardrail."""
    return [Candidate(dict(r["changes"]), "pipeline", reason, predicted=r["predicted"])
            for r in finding.evidence.get("remedies", ())]


def compute_remedies(base: Mapping[str, Any], reason: str, on_gpu: bool) -> list[Candidate]:
    """Faster kernels for a compute-bound job; only on GPUs, where they apply."""
    if not on_gpu:
        return []
    out = []
    if base.get("precision.mode", "fp32") == "fp32":
        out.append(Candidate({"precision.mode": "bf16"}, "compute", reason))
    if _have("plan.compile") and not base.get("plan.compile"):
        out.append(Candidate({"plan.compile": True}, "compute", reason))
    return out


def control_of(finding: Any) -> str:
    """The launcher control for a finding: its own `control`, else the one its kind has."""
    from tandem.analyze.diagnosis.diagnose import IN_MEMORY_DATA, NO_COMM

    control = getattr(finding, "control", None)
    if control is None:
        control = {"input-bound": IN_MEMORY_DATA,
                   "communication-bound": NO_COMM}.get(finding.kind)
    return control or ""


def acted_on() -> frozenset[str]:
    """The finding kinds the tuner acts on (the performance ones, and a mixture's task
    that stalls)."""
    from tandem.analyze.diagnosis.diagnose import PERFORMANCE_KINDS

    return PERFORMANCE_KINDS | {"balanced", "task-stalls"}


def families_of(findings: Iterable[Any]) -> dict[str, Any]:
    """family -> the finding that names it, most severe first."""
    by_kind = {"input-bound": "data", "data-imbalance": "data", "communication-bound": "comm",
               "memory-bound": "memory", "compute-bound": "compute",
               "pipeline-bubble": "pipeline", "task-stalls": "mixing"}
    out: dict[str, Any] = {}
    for f in findings:
        family = by_kind.get(f.kind)
        if family and family not in out:
            out[family] = f
    return out


def parse_try(text: str) -> Candidate:
    """'data.workers=2,plan.bucket_mb=100' -> a user candidate (values as TOML would read)."""
    changes: dict[str, Any] = {}
    for part in text.split(","):
        key, eq, value = part.strip().partition("=")
        if not eq or key not in known_keys():
            raise ValueError(f"--try {text!r}: {part.strip()!r} is not section.field=VALUE "
                             "with a known config key (see `tandem config`)")
        changes[key] = _literal(value.strip())
    return Candidate(changes, "user", "asked for with --try")


def _literal(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip("\"'")
