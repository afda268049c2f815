"""The tuner's output: a plan file holding only the changed keys, each with its evidence.

`tandem run --plan FILE` and `tandem.fit` (`--plan FILE` in the script's argv, or
TANDEM_PLAN) layer it over the script's defaults and --config.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tandem.config import _toml_value
from tandem.tune.session import TuneResult


def render(result: TuneResult, script: str, nproc: int, store: str, min_gain: float) -> str:
    """The plan file text for a tune result."""
    lines = [f"# tandem tune plan for {script} on {nproc} process(es)",
             f"# session {result.session_id}: {result.trials} trial(s), {result.wall_s:.0f} s; "
             f"decision record: tandem report {result.session_id} --store {store}"]
    if result.baseline is not None:
        lines.append(f"# baseline: {result.baseline.text()} samples/s (steady-state mean, "
                     "95% CI)")
    found = [r for r in result.records if r.kind == "baseline"]
    if found:
        lines.append(f"# {found[0].decision}")
    if not result.changes:
        lines.append(f"# keep the current plan: no trial beat it by more than {min_gain:.0%} "
                     "outside the noise (and passed the convergence guardrail)")
        return "\n".join(lines) + "\n"
    if result.speedup is not None:
        lines.append(f"# chosen plan: {result.speedup.text()}x the baseline's samples/s "
                     "(95% CI)")
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


def write(path: Path, text: str) -> Path:
    """Write the plan file atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path
