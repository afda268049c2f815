"""What a diagnosis says: a Finding, and the shared measures findings are made of."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tandem.analyze import stats
from tandem.analyze.report.figures import Metric, drop_warmup, series_of
from tandem.monitor.catalogue import TIME_STEP

SEVERITIES = ("high", "medium", "low", "info")
PERFORMANCE_KINDS = frozenset({
    "input-bound", "communication-bound", "waiting-for-peers", "memory-bound", "straggler",
    "data-imbalance", "compute-bound", "pipeline-bubble"})

# Control experiments: how a finding's claim is checked (tune/controls.py runs them).
NO_COMM = "no_comm"  # the same job with no gradient communication (replicas never meet)
IN_MEMORY_DATA = "in_memory_data"  # the same job on batches already in memory
# Where a run's control experiments are kept: its tuner-trial rows with this id prefix,
# followed by the finding's kind (`tandem report RUN --validate` writes them).
VALIDATION_PREFIX = "validate:"


@dataclass(frozen=True)
class Finding:
    """One named observation about a run, with the numbers behind it and what to try.

    A performance finding names a cause and so predicts what removing it would gain
    (`predicted_speedup`: step time over step time without it); `control` names the
    experiment that removes it, and `validation` holds that experiment's outcome when it
    was run: {"state": "confirmed" | "refuted" | "inconclusive", "predicted": x,
    "measured": y, "interval": [lo, hi], "runs": n, ...}. A refuted finding is reported
    as refuted, never as a bottleneck.
    """

    kind: str
    severity: str
    evidence: dict[str, Any]
    message: str
    suggestions: list[str] = field(default_factory=list)
    predicted_speedup: float | None = None
    control: str | None = None
    validation: dict[str, Any] | None = None


def with_validations(findings: Sequence[Finding], trials: Sequence[Mapping[str, Any]]
                     ) -> list[Finding]:
    """`findings` with the outcomes of their control experiments attached, read from a
    run's tuner-trial rows (`RunStore.trials`)."""
    done = {t["trial_id"][len(VALIDATION_PREFIX):]: t["figures"] for t in trials
            if str(t["trial_id"]).startswith(VALIDATION_PREFIX)}
    return [replace(f, validation=done[f.kind]) if f.kind in done else f for f in findings]


@dataclass(frozen=True)
class Context:
    """What every finding reads: the run's rows by name, its config, its device."""

    groups: Mapping[str, Sequence[Metric]]
    config: Mapping[str, Any] | None = None
    device: str | None = None  # "cpu", "cuda:0", ...; None: not known
    plan: Mapping[str, Any] | None = None  # the run's resolved plan, as stored
    env: Mapping[str, Any] | None = None  # the run's environment, as stored

    @property
    def on_gpu(self) -> bool:
        """Whether advice about GPUs applies (an unknown device is not assumed to be one)."""
        return bool(self.device) and str(self.device).startswith("cuda")

    def cfg(self, dotted: str) -> Any:
        """A value of the run's config by its dotted key, or None."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    @property
    def accumulation(self) -> int | None:
        """Micro-batches per optimizer step, as the run's plan ran them (None: not known;
        1 when train.micro_batch was left to derive, which never accumulates)."""
        value = (self.plan or {}).get("accumulation")
        if isinstance(value, int) and value > 0:
            return value
        return 1 if self.cfg("train.micro_batch") == 0 else None

    @property
    def nodes(self) -> int | None:
        """Hosts the run spanned (None: not recorded)."""
        env = self.env or {}
        world, local = env.get("world_size"), env.get("local_world_size")
        if not isinstance(world, int) or not isinstance(local, int) or local <= 0:
            return None
        return max(1, -(-world // local))


@dataclass(frozen=True)
class Share:
    """A phase's median seconds per step against the median step time."""

    phase_s: float
    step_s: float
    windows: int

    @property
    def share(self) -> float:
        """The phase's part of the step."""
        return self.phase_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def speedup_without(self) -> float:
        """Step time over step time with this phase gone: what removing it would gain."""
        rest = self.step_s - self.phase_s
        return self.step_s / rest if rest > 0 else math.inf

    def quote(self) -> str:
        """e.g. '41% of step time (0.0119 s of 0.029 s)'."""
        return f"{self.share:.0%} of step time ({self.phase_s:.3g} s of {self.step_s:.3g} s)"

    def evidence(self) -> dict[str, Any]:
        """The numbers, for the finding's evidence."""
        return {"share": self.share, "phase_s": self.phase_s, "step_s": self.step_s,
                "windows": self.windows}


def share(groups: Mapping[str, Sequence[Metric]], name: str) -> Share | None:
    """Median phase time and median step time over the steady windows that have both."""
    p_steps, p_vals = series_of(groups, name)
    s_steps, s_vals = series_of(groups, TIME_STEP)
    step_at = dict(zip(s_steps, s_vals, strict=True))
    pairs = [(s, p, step_at[s]) for s, p in zip(p_steps, p_vals, strict=True)
             if s in step_at and math.isfinite(p) and math.isfinite(step_at[s])]
    if not pairs:
        return None
    kept = drop_warmup(pairs)
    return Share(stats.median([p for _, p, _ in kept]), stats.median([t for _, _, t in kept]),
                 len(kept))


def severity(fraction: float, threshold: float) -> str:
    """"high" at twice the threshold or more, else "medium"."""
    return "high" if fraction >= 2 * threshold else "medium"
