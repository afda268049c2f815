"""What the tuner may try: candidates from a diagnosis, controls that bound them, the rest.

A candidate is a set of config changes over the current plan. The diagnosis orders the
work: each finding names a family of changes, and a family comes with a cheap control
run that bounds what any change of that family can gain:

* input-bound -> the data control: the same job with its training samples served from
  memory (`shim.py`, the tuner's own wrapper: the first items are loaded once and
  reused), so data loading costs nothing. No data.* change can beat it.
* communication-bound -> the communication control: plan.strategy localsgd with
  sync_every beyond the trial's steps, i.e. no gradient communication at all. No
  comm_hook, bucket or low-communication strategy can beat it.

Only keys present in tandem.config at run time are proposed (plan.activation_checkpointing
and plan.compile, for instance, only where the config has them). Changes that alter the
numerics (compression, precision, batch split, local SGD, optimizer settings) are lossy:
they must also pass the convergence guardrail (`guard.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tandem.config import Config, _field_types, _set, sections, validate

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
EXACT_STRATEGIES = frozenset({"auto", "ddp", "fsdp", "single"})


@dataclass(frozen=True)
class Candidate:
    """Config changes to try over the current plan, and why."""

    changes: dict[str, Any]
    family: str  # data, comm, memory, compute, search, user
    reason: str
    control: str = ""  # non-empty: a bound, never adopted

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


def check(base: Mapping[str, Any], changes: Mapping[str, Any]) -> str | None:
    """Why `changes` over the flat config `base` is not a valid config (None: it is)."""
    config = Config()
    keys = known_keys()
    try:
        for key, value in {**base, **changes}.items():
            if key in keys:
                _set(config, key, value)
        validate(config)
    except ValueError as err:
        return str(err)
    return None


def _have(*keys: str) -> bool:
    present = known_keys()
    return all(k in present for k in keys)


def _strategy(base: Mapping[str, Any]) -> str:
    return str(base.get("plan.strategy", "auto"))


def _ddp(base: Mapping[str, Any], world: int) -> bool:
    return world > 1 and _strategy(base) in ("auto", "ddp") and int(base.get("plan.tp", 1)) == 1


def _data(base: Mapping[str, Any], reason: str, cpus: int) -> list[Candidate]:
    workers = int(base.get("data.workers", 0))
    prefetch = int(base.get("data.prefetch", 2))
    out = []
    for more in sorted({max(2, 2 * workers), max(4, 4 * workers)}):
        if more != workers and more <= max(2, 2 * cpus):
            out.append(Candidate({"data.workers": more}, "data", reason))
    if workers > 0:
        out.append(Candidate({"data.prefetch": 2 * prefetch}, "data", reason))
    else:
        out.append(Candidate({"data.workers": 2, "data.prefetch": 2 * prefetch}, "data",
                             reason))
    return out


def _comm(base: Mapping[str, Any], reason: str, world: int) -> list[Candidate]:
    if not _ddp(base, world):
        return []
    bucket = float(base.get("plan.bucket_mb", 25.0))
    out = [Candidate({"plan.bucket_mb": bucket * 4}, "comm", reason),
           Candidate({"plan.static_graph": True}, "comm", reason)]
    if base.get("plan.comm_hook", "none") == "none":
        out += [Candidate({"plan.comm_hook": "fp16"}, "comm", reason),
                Candidate({"plan.comm_hook": "powersgd"}, "comm", reason)]
    out += [Candidate({"plan.strategy": "localsgd", "plan.comm_hook": "none"}, "comm", reason),
            Candidate({"plan.strategy": "diloco", "plan.comm_hook": "none"}, "comm", reason)]
    return out


def _memory(base: Mapping[str, Any], reason: str, world: int) -> list[Candidate]:
    out = []
    if _have("plan.activation_checkpointing") and not base.get("plan.activation_checkpointing"):
        out.append(Candidate({"plan.activation_checkpointing": True}, "memory", reason))
    if world > 1 and _strategy(base) in ("auto", "ddp"):
        out.append(Candidate({"plan.strategy": "fsdp", "plan.comm_hook": "none"}, "memory",
                             reason))
    micro = int(base.get("train.micro_batch", 0))
    global_batch = int(base.get("train.global_batch", 0))
    per_rank = micro or global_batch // max(world, 1)
    if per_rank >= 2 and per_rank % 2 == 0:
        out.append(Candidate({"train.micro_batch": per_rank // 2}, "memory", reason))
    return out


def _compute(base: Mapping[str, Any], reason: str) -> list[Candidate]:
    out = []
    if base.get("precision.mode", "fp32") == "fp32":
        out.append(Candidate({"precision.mode": "bf16"}, "compute", reason))
    if _have("plan.compile") and not base.get("plan.compile"):
        out.append(Candidate({"plan.compile": True}, "compute", reason))
    return out


def from_findings(findings: Iterable[Any], base: Mapping[str, Any], world: int,
                  cpus: int) -> tuple[list[Candidate], list[Candidate]]:
    """(controls, candidates) for a diagnosis, most severe finding first."""
    controls: list[Candidate] = []
    candidates: list[Candidate] = []
    for f in findings:
        reason = f"{f.kind}: {f.message.split(' -> ')[0]}"
        if f.kind == "input-bound":
            controls.append(Candidate({}, "data", reason, control=DATA_CONTROL))
            candidates += _data(base, reason, cpus)
        elif f.kind == "communication-bound" and _ddp(base, world):
            controls.append(comm_control(reason))
            candidates += _comm(base, reason, world)
        elif f.kind == "memory-bound":
            candidates += _memory(base, reason, world)
        elif f.kind == "compute-bound":
            candidates += _compute(base, reason)
        elif f.kind == "straggler":
            candidates += _data(base, reason, cpus)[:1]
    return controls, candidates


def comm_control(reason: str) -> Candidate:
    """No gradient communication during the trial: local SGD that never meets."""
    return Candidate({"plan.strategy": "localsgd", "plan.comm_hook": "none",
                      "plan.sync_every": 1_000_000}, "comm", reason, control=COMM_CONTROL)


def remaining(base: Mapping[str, Any], world: int, cpus: int) -> list[Candidate]:
    """Every family's candidates, for the search once the diagnosis' ones are spent."""
    why = "search: the diagnosis named no further change"
    return [*_data(base, why, cpus), *_comm(base, why, world), *_compute(base, why),
            *_memory(base, why, world)]


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
