"""Scaling efficiency: a run's throughput against a one-process run of the same work."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tandem.monitor.store import RunStore

log = logging.getLogger("tandem")

# What must match for a one-process run to count as the reference of the same work.
_SAME = (("train", "global_batch"), ("train", "micro_batch"), ("precision", "mode"),
         ("plan", "device"), ("plan", "activation_checkpointing"), ("plan", "compile"))


def _get(tree: dict[str, Any], path: tuple[str, str]) -> Any:
    return (tree.get(path[0]) or {}).get(path[1])


def reference_run(store: RunStore, run_id: str) -> dict[str, Any] | None:
    """The latest completed one-process run of the same script and batch, precision and
    device settings as `run_id` (None when there is none)."""
    run = store.run(run_id)
    script = (run.get("env") or {}).get("script")
    if not script:
        return None
    best = None
    for other in store.runs():
        if other["run_id"] == run_id or other.get("status") != "completed":
            continue
        if (other.get("plan") or {}).get("world_size") != 1:
            continue
        if (other.get("env") or {}).get("script") != script:
            continue
        if any(_get(other["config"], p) != _get(run["config"], p) for p in _SAME):
            continue
        rate = (other.get("summary") or {}).get("samples_per_s")
        if rate and (best is None or other["started"] > best["started"]):
            best = other
    return best


def scaling_figures(store_path: Path, run_id: str, samples_per_s: float,
                    world_size: int) -> dict[str, Any]:
    """{"scaling_efficiency": rate / (N x reference rate), "scaling_reference": run id} for a
    multi-process run with a one-process reference in the store; {} otherwise."""
    if world_size <= 1 or samples_per_s <= 0 or not Path(store_path).exists():
        return {}
    with RunStore(store_path) as store:
        ref = reference_run(store, run_id)
    if ref is None:
        return {}
    ref_rate = ref["summary"]["samples_per_s"]
    return {"scaling_efficiency": samples_per_s / (world_size * ref_rate),
            "scaling_speedup": samples_per_s / ref_rate,
            "scaling_reference": ref["run_id"]}
