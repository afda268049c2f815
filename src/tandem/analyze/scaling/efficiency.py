"""Scaling efficiency: a run's throughput against a comparable one-process run of the same
work (as long, and not slowed by other jobs), or a note saying why there is none."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tandem.monitor.store import RunStore
from tandem.status import RunStatus

log = logging.getLogger("tandem")

# What must match for a one-process run to count as the reference of the same work.
_SAME = (("train", "global_batch"), ("train", "micro_batch"), ("precision", "mode"),
         ("plan", "device"), ("plan", "activation_checkpointing"), ("plan", "compile"))


def _get(tree: dict[str, Any], path: tuple[str, str]) -> Any:
    return (tree.get(path[0]) or {}).get(path[1])


# A reference is comparable when it ran about as long (its warm-up and one-time costs
# weigh alike): steps within this factor either way.
MAX_STEPS_RATIO = 2.0
# ... and beside no more foreign CPU-bound threads than this per core (the scaling model's
# `background_threads`, median over the reference's windows): a one-process run slowed by
# other jobs makes every multi-process run look super-linear.
MAX_BACKGROUND_PER_CORE = 0.25
# The newest candidates looked at: each one's load is read from all its metric rows, at
# the end of the run that asks.
MAX_CANDIDATES = 10


def candidates(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """Completed one-process runs of the same script and batch, precision and device
    settings as `run_id`, newest first."""
    run = store.run(run_id)
    script = (run.get("env") or {}).get("script")
    if not script:
        return []
    found = []
    for other in store.runs():
        if other["run_id"] == run_id or other.get("status") != RunStatus.COMPLETED:
            continue
        if (other.get("plan") or {}).get("world_size") != 1:
            continue
        if (other.get("env") or {}).get("script") != script:
            continue
        if any(_get(other["config"], p) != _get(run["config"], p) for p in _SAME):
            continue
        if (other.get("summary") or {}).get("samples_per_s"):
            found.append(other)
    return sorted(found, key=lambda r: r["started"], reverse=True)


def _background(store_path: Path, ref: dict[str, Any]) -> tuple[float | None, int, str]:
    """(foreign CPU-bound threads beside `ref`, cores, why not known) for a one-process
    run; the threads are None when its load cannot be read."""
    from tandem.analyze.scaling.inputs import run_figures
    from tandem.analyze.scaling.model import background_threads

    try:
        fig = run_figures(store_path, ref["run_id"])
    except ValueError as err:
        return None, 0, str(err)
    if not fig.host_cpu:
        return None, fig.cores, "no host and process CPU figures"
    return background_threads(fig)[0], fig.cores, ""


def why_not(store_path: Path, ref: dict[str, Any], steps: int) -> str:
    """Why `ref` cannot stand for one process of a run of `steps` steps ('' when it can)."""
    ref_steps = int((ref.get("summary") or {}).get("steps") or 0)
    if ref_steps <= 0 or steps <= 0 or not (
            1 / MAX_STEPS_RATIO <= ref_steps / steps <= MAX_STEPS_RATIO):
        return (f"{ref['run_id']} ran {ref_steps} steps against this run's {steps} (a "
                f"reference must be within {MAX_STEPS_RATIO:g}x)")
    background, cores, unknown = _background(store_path, ref)
    if background is None:
        return f"{ref['run_id']}'s foreign CPU load is not known ({unknown})"
    bound = MAX_BACKGROUND_PER_CORE * max(cores, 1)
    if background > bound:
        return (f"{ref['run_id']} ran beside {background:.1f} foreign CPU-bound threads "
                f"(more than {bound:.2g}: {MAX_BACKGROUND_PER_CORE:g} a core on {cores})")
    return ""


def scaling_figures(store_path: Path, run_id: str, samples_per_s: float,
                    world_size: int, steps: int) -> dict[str, Any]:
    """For a multi-process run of `steps` steps: its throughput against the newest
    comparable one-process run of the same work (`why_not`), as "scaling_speedup",
    "scaling_efficiency" (speed-up over N) and "scaling_reference" (the run's id);
    otherwise "scaling_note" says why there is no figure. {} for a one-process run."""
    if world_size <= 1 or samples_per_s <= 0 or not Path(store_path).exists():
        return {}
    with RunStore(store_path) as store:
        found = candidates(store, run_id)
    if not found:
        return {"scaling_note": "no scaling figure: no completed one-process run of this "
                                "script with the same batch, precision and device"}
    reasons = []
    for ref in found[:MAX_CANDIDATES]:
        reason = why_not(store_path, ref, steps)
        if reason:
            reasons.append(reason)
            continue
        ref_rate = ref["summary"]["samples_per_s"]
        return {"scaling_efficiency": samples_per_s / (world_size * ref_rate),
                "scaling_speedup": samples_per_s / ref_rate,
                "scaling_reference": ref["run_id"]}
    more = f" (and {len(reasons) - 1} older)" if len(reasons) > 1 else ""
    return {"scaling_note": f"no scaling figure: no comparable one-process run; "
                            f"{reasons[0]}{more}"}

