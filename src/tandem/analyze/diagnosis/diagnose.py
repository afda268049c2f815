"""Turn a run's figures into a verdict: named bottlenecks with evidence, the gain each
predicts, and plan changes.

Shares are medians over the steady logging windows (the first window is left out when
there are at least 4: it holds warm-up), phase time over step time, both job-wide
(rank -1) or averaged over ranks when only per-rank rows exist.

=====================  ==========================================================
finding                fires when
=====================  ==========================================================
input-bound            ``time/data`` > INPUT_BOUND_SHARE (20%) of ``time/step``
communication-bound    ``time/comm_exposed`` (the exposed wire: what no rank could
                       hide) > COMM_BOUND_SHARE (25%) of ``time/step``; when it is
                       far above the wire time the measured link predicts
                       (``time/wire_predicted``), it says the excess is not bandwidth
waiting-for-peers      ``time/sync_wait`` (ranks waiting for slower ones at the
                       collective) > WAIT_SHARE (15%) of ``time/step``
memory-bound           ``mem/cuda_peak_bytes`` > MEMORY_BOUND_SHARE (90%) of
                       ``mem/cuda_total_bytes`` on any rank in any window
straggler              a rank's ``straggler/score`` (its own time / the median over
                       ranks) > STRAGGLER_SCORE (1.15) in more than
                       STRAGGLER_WINDOW_SHARE (50%) of at least
                       STRAGGLER_MIN_WINDOWS (2) windows
data-imbalance         a rank's ``time/data`` > IMBALANCE_RATIO (2x) the median over
                       ranks and > IMBALANCE_MIN_SHARE (10%) of its ``time/step``, in
                       more than half of at least STRAGGLER_MIN_WINDOWS windows
unstable               any non-finite loss or grad norm, any event whose kind is in
                       UNSTABLE_EVENT_KINDS, a loss rise with robust z > LOSS_SPIKE_Z (6)
                       and > LOSS_SPIKE_MIN_RISE (5%) of the loss, or ``loss_scale``
                       falling in >= LOSS_SCALE_DROPS (3) windows; an outlier that is
                       small on the run's scale (a loss at most SMALL_LOSS_SHARE (5%) of
                       the starting loss, a gradient norm at most the starting one)
                       does not count
outliers               only such small outliers: said as "info", not as instability
compute-bound          ``time/compute`` > COMPUTE_BOUND_SHARE (70%) of ``time/step``
                       and no other performance finding
balanced               ``time/step`` exists and no other performance finding fired
timings-inconsistent   the measured phases add up to more than PHASE_SUM_LIMIT (110%)
                       of the step: no phase-based bottleneck is named
pipeline-bubble        ``pp/bubble`` (the stages' mean idle share) > BUBBLE_SHARE
                       (15%); remedies priced by replaying the schedule's action table
                       at the stages' measured costs (`find_pipeline.py`)
batch-scaling          ``grad_noise_scale`` was measured: what doubling the global
                       batch would save in steps (`find_scale.py`)
task-stalls            a mixture's source whose ``task/NAME/eval_loss`` (else
                       ``task/NAME/loss``) fell by less than TASK_STALL (2%) or rose
                       from the first third of at least TASK_MIN_WINDOWS (6) points to
                       the last, while another's fell by at least TASK_FALL (10%)
                       (`find_tasks.py`)
=====================  ==========================================================

Severity is "high" when a share is at least twice its threshold (or on any non-finite
value), "medium" past the threshold, "low" for compute-bound (where a run should be)
and "info" for balanced; a stalled task is "low", a rising one "medium". Findings come
sorted by severity, then by size. Advice that needs a GPU is given only for runs on one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tandem.analyze.diagnosis.find_health import unstable
from tandem.analyze.diagnosis.find_phases import (
    COMM_BOUND_SHARE,
    COMPUTE_BOUND_SHARE,
    INPUT_BOUND_SHARE,
    WAIT_SHARE,
    balanced,
    communication_bound,
    compute_bound,
    input_bound,
    phase_sum,
    waiting_for_peers,
)
from tandem.analyze.diagnosis.find_pipeline import pipeline_bubble
from tandem.analyze.diagnosis.find_ranks import (
    MEMORY_BOUND_SHARE,
    STRAGGLER_SCORE,
    data_imbalance,
    memory_bound,
    straggler,
)
from tandem.analyze.diagnosis.find_scale import batch_scaling
from tandem.analyze.diagnosis.find_tasks import task_stalls
from tandem.analyze.diagnosis.finding import (
    IN_MEMORY_DATA,
    NO_COMM,
    PERFORMANCE_KINDS,
    SEVERITIES,
    Context,
    Finding,
)
from tandem.analyze.report.figures import Metric, by_name, in_window

PHASE_SUM_LIMIT = 1.10

__all__ = ["COMM_BOUND_SHARE", "COMPUTE_BOUND_SHARE", "INPUT_BOUND_SHARE", "IN_MEMORY_DATA",
           "MEMORY_BOUND_SHARE", "NO_COMM", "PERFORMANCE_KINDS", "SEVERITIES",
           "STRAGGLER_SCORE", "WAIT_SHARE", "Finding", "diagnose", "diagnose_run", "verdict"]


def diagnose(metrics: Iterable[Metric], events: Iterable[Mapping[str, Any]] = (),
             window: tuple[int, int] | None = None,
             config: Mapping[str, Any] | None = None,
             device: str | None = None, plan: Mapping[str, Any] | None = None,
             env: Mapping[str, Any] | None = None) -> list[Finding]:
    """Findings for one run's metric rows (and events), most severe first.

    `window` keeps only steps in (first, last), inclusive. `config` (the run's resolved
    config tree, as stored) lets suggestions quote current values; `device` (the run's,
    e.g. "cpu" or "cuda:0") keeps GPU advice off other hardware; `plan` and `env` (as
    stored) keep advice about accumulation and nodes off runs without them. Returns an empty list
    when the rows hold nothing to judge.
    """
    rows = in_window(metrics, window)
    chosen = [e for e in events if window is None or window[0] <= e["step"] <= window[1]
              or e["step"] < 0]
    ctx = Context(by_name(rows), config, device, plan, env)
    found = _performance(ctx)
    if (health := unstable(ctx.groups, chosen, config)) is not None:
        found.append(health)
    if (scaling := batch_scaling(ctx)) is not None:
        found.append(scaling)
    found += task_stalls(ctx)
    return sorted(found, key=lambda f: (SEVERITIES.index(f.severity),
                                        -float(f.evidence.get("share", 0.0))))


def diagnose_run(run: Mapping[str, Any], metrics: Iterable[Metric],
                 events: Iterable[Mapping[str, Any]] = (),
                 window: tuple[int, int] | None = None) -> list[Finding]:
    """`diagnose` with what a stored run record holds (its config, device, plan and
    environment): the report, the dashboard and the tuner judge a run alike."""
    env = run.get("env") or {}
    return diagnose(metrics, events, window, config=run.get("config"),
                    device=env.get("device"), plan=run.get("plan"), env=env)


def _performance(ctx: Context) -> list[Finding]:
    total = phase_sum(ctx)
    if total is not None and total > PHASE_SUM_LIMIT:
        return [Finding(
            "timings-inconsistent", "info", {"phase_sum": total},
            f"the measured phases add up to {total:.0%} of the step time: these timings "
            "cannot name a bottleneck (a clock read in the wrong place, or steps that "
            "overlap); what is known: the step time and throughput")]
    found = [f for f in (input_bound(ctx), communication_bound(ctx), waiting_for_peers(ctx),
                         memory_bound(ctx.groups), straggler(ctx),
                         data_imbalance(ctx.groups), pipeline_bubble(ctx)) if f is not None]
    if not found and (compute := compute_bound(ctx)) is not None:
        found.append(compute)
    if not found and (calm := balanced(ctx)) is not None:
        found.append(calm)
    return found


def verdict(findings: Sequence[Finding]) -> Finding | None:
    """The finding to lead with: the most severe one not refuted by its control."""
    standing = [f for f in findings
                if (f.validation or {}).get("state") != "refuted"]
    return standing[0] if standing else (findings[0] if findings else None)
