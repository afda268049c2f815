"""Helpers shared by the communication and memory benchmarks: runs, store figures, tables."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tandem.monitor.store import RunStore  # noqa: E402

WIDE_MNIST1D = ROOT / "benchmarks" / "wide_mnist1d.py"
CHAR_LM = ROOT / "examples" / "char_lm.py"

# Flags that keep a benchmark run lean: no checkpoints, no live bar.
QUIET = ["--checkpoint.every", "0", "--checkpoint.at_end", "false",
         "--monitor.progress", "off"]


def tandem_command(launcher: Sequence[str], script: Path, flags: Sequence[str]) -> list[str]:
    """`tandem run LAUNCHER... SCRIPT FLAGS...` through this interpreter."""
    return [sys.executable, "-m", "tandem.cli", "run", *launcher, str(script), *flags]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark's child: one thread per process, tandem importable."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path, **(extra or {}))


def run_checked(cmd: Sequence[str], *, timeout: float, env: dict[str, str],
                what: str) -> subprocess.CompletedProcess[str]:
    """Run `cmd` to completion; raise with the tail of its output when it fails."""
    try:
        done = subprocess.run(list(cmd), env=env, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as err:
        tail = (err.stderr or b"")[-3000:]
        raise RuntimeError(f"{what} ran past {timeout:.0f} s:\n{tail!r}") from None
    if done.returncode:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done


def summary(run_dir: Path) -> dict[str, Any]:
    """The summary.json rank 0 wrote at the end of a run."""
    return json.loads((run_dir / "summary.json").read_text())


def window_values(store_path: Path, name: str, metric: str, rank: int = -1) -> list[float]:
    """A run's per-window values of `metric` (job-wide by default), in step order."""
    with RunStore(store_path) as store:
        rows = store.metrics(store.run(name)["run_id"], name=metric, rank=rank)
    return [r["value"] for r in rows]


def window_steps(store_path: Path, name: str, metric: str, rank: int = -1) -> list[int]:
    """The steps at which a run recorded `metric` (the ends of its logging windows)."""
    with RunStore(store_path) as store:
        rows = store.metrics(store.run(name)["run_id"], name=metric, rank=rank)
    return [r["step"] for r in rows]


def steady(values: list[float]) -> float:
    """Median of per-window values, the first window (start-up, warm-up) left out."""
    if not values:
        return float("nan")
    return statistics.median(values[1:] if len(values) > 1 else values)


def mib(nbytes: float) -> str:
    """Bytes as MiB with three significant decimals."""
    return f"{nbytes / 2**20:,.3f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with columns padded to their widest cell."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    rule = "| " + " | ".join("-" * w for w in widths) + " |"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def planner_inputs(task_path: Path) -> tuple[Any, Any, Any]:
    """Print the host's load; the task at `task_path` with the planner's model profile and
    optimizer for it (what `tandem plan` prices a layout from: `optimizer_profile`)."""
    from tandem.planner.command import load_task, model_profile, optimizer_profile

    print(f"host load (1 min): {os.getloadavg()[0]:.1f}")
    task = load_task(str(task_path), "task")
    return task, model_profile(task), optimizer_profile(task)
