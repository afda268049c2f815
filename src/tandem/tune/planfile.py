"""The tuner's output: a plan file holding only the changed keys, each with its evidence.

`tandem run --plan FILE` and `tandem.fit` (`--plan FILE` in the script's argv, or
TANDEM_PLAN) layer it over the script's defaults and --config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tandem.config.schema import _toml_value
from tandem.tune.outcome import TuneResult


def render(result: TuneResult, script: str, nproc: int, store: str, min_gain: float) -> str:
    """The plan file text for a tune result."""
    lines = [f"# tandem tune plan for {script} on {nproc} process(es)",
             f"# session {result.session_id}: {result.trials} trial(s), {result.wall_s:.0f} s; "
             f"decision record: tandem report {result.session_id} --store {store}"]
    if result.baseline is not None:
        lines.append(f"# baseline: {result.baseline.text()} samples/s (geometric mean over "
                     f"{result.baseline.n} runs of the current plan, 95% CI)")
    found = [r for r in result.records if r.kind == "baseline"]
    if found:
        lines.append(f"# {found[0].decision}")
    noise = result.noise or {}
    placebo = noise.get("placebo")
    if placebo:
        sd = noise.get("pair_sd")
        lines.append(f"# noise: the current plan against itself measured {_iv(placebo)}x over "
                     f"{noise.get('placebo_pairs')} paired runs (pair sd "
                     f"{100 * sd if sd is not None else float('nan'):.1f}%); a change had to "
                     f"clear {noise.get('floor', math.inf):.3g}x at its lower bound")
    if not result.changes:
        lines.append(f"# keep the current plan: no change cleared the noise floor (at least "
                     f"{1 + min_gain:g}x, or the placebo's bias when it showed one) and the "
                     "convergence guardrail")
        return "\n".join(lines) + "\n"
    if result.speedup is not None:
        lines.append(f"# chosen plan: {result.speedup.text()}x the baseline's samples/s "
                     "(95% CI, the run as the unit)")
    by_section: dict[str, list[tuple[str, Any]]] = {}
    for key, value in result.changes.items():
        section, _, name = key.partition(".")
        by_section.setdefault(section, []).append((name, value))
    said = ""
    for section, items in by_section.items():
        lines += ["", f"[{section}]"]
        for name, value in items:
            why = result.evidence.get(f"{section}.{name}")
            if why and why != said:
                lines.append(f"# {why}")
                said = why
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _iv(d: Mapping[str, Any]) -> str:
    return f"{d['estimate']:.3g} [{d['low']:.3g}, {d['high']:.3g}]"


def write(path: Path, text: str) -> Path:
    """Write the plan file atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
