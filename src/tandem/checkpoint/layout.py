"""Where checkpoints live under a root, and which old ones retention removes."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path

from tandem.checkpoint import manifest
from tandem.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"step_(\d{9,})")


def step_name(step: int) -> str:
    """Return the directory name of a step's checkpoint, e.g. ``step_000000120``."""
    return f"step_{step:09d}"


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Return (step, path) for every ``step_*`` directory under root, newest first.

    Committed or not: callers decide what a directory is worth by its manifest.
    """
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def lineage_of(path: Path) -> str | None:
    """The lineage recorded in ``path``'s manifest if all its files are present (sizes
    checked), else None: not counted, and never deleted, by retention."""
    try:
        return str(manifest.verify(path, hashes=False).get("lineage", ""))
    except CheckpointError as err:
        logger.debug("not counted by retention: %s", err)
        return None


def prune(root: Path, keep: int, newest: Path, lineage: str = "") -> None:
    """Delete this lineage's checkpoints older than its newest ``keep``; sweep temp dirs.

    ``newest`` (the checkpoint just committed) is always kept, and so is everything
    with a higher step (a rolled-back run's future is for the trainer to judge). Only
    checkpoints whose manifest names ``lineage`` (the run that wrote them) and whose
    files are all present count and can be deleted: a damaged checkpoint, or one that
    another run wrote, is never deleted by retention. ``keep=0`` keeps every checkpoint.
    Call on rank 0 only, with no save in flight under root.
    """
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX) and path.is_dir():
            logger.info("removing stale temporary checkpoint directory %s", path)
            shutil.rmtree(path, ignore_errors=True)
    if keep == 0:
        return
    ours = [(step, path) for step, path in step_dirs(root)
            if path == newest or lineage_of(path) == lineage]
    kept = {path for _, path in ours[:keep]} | {newest}
    floor = min(step for step, path in ours if path in kept)
    for step, path in ours:
        if step < floor and path not in kept:
            logger.info("retention (keep=%d): removing checkpoint %s", keep, path)
            shutil.rmtree(path)


def set_aside(root: Path, from_step: int, label: str = "rolled-back") -> list[Path]:
    """Rename checkpoints of step >= ``from_step`` to ``.<label>-step_*``.

    A rollback's (they hold state from after a bad step) or a fresh start's: a resume
    must not pick them, and they are kept under a name no scan matches, for inspection,
    never deleted (a name already taken gets a numbered suffix). Rank 0 only.
    """
    moved = []
    for step, path in step_dirs(root):
        if step >= from_step:
            target = path.with_name(f".{label}-{path.name}")
            n = 1
            while target.exists():
                n += 1
                target = path.with_name(f".{label}-{path.name}.{n}")
            path.rename(target)
            moved.append(target)
    return moved


def discard(tmp: Path) -> None:
    """Remove an uncommitted temp dir (a failed save's)."""
    shutil.rmtree(tmp, ignore_errors=True)
