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


def is_usable(path: Path) -> bool:
    """Return True if ``path`` has a manifest whose files are all present with their sizes."""
    try:
        manifest.verify(path, hashes=False)
    except CheckpointError as err:
        logger.debug("not counted by retention: %s", err)
        return False
    return True


def prune(root: Path, keep: int, newest: Path) -> None:
    """Delete checkpoints older than the newest ``keep`` usable ones, and stale temp dirs.

    ``newest`` (the checkpoint just committed) is always kept, and so is everything
    with a higher step (a rolled-back run's future is for the trainer to judge). Only
    usable checkpoints count towards ``keep``, so a corrupt newer checkpoint never pushes
    out the last good one; anything, usable or not, older than the oldest kept checkpoint
    goes. ``keep=0`` keeps every checkpoint. Call on rank 0 only, with no save in flight
    under root.
    """
    for path in root.iterdir():
        if path.name.startswith(TMP_PREFIX) and path.is_dir():
            logger.info("removing stale temporary checkpoint directory %s", path)
            shutil.rmtree(path, ignore_errors=True)
    if keep == 0:
        return
    dirs = step_dirs(root)
    usable = [path for _, path in dirs if path == newest or is_usable(path)]
    kept = set(usable[:keep]) | {newest}
    floor = min(step for step, path in dirs if path in kept)
    for step, path in dirs:
        if step < floor and path not in kept:
            logger.info("retention (keep=%d): removing checkpoint %s", keep, path)
            shutil.rmtree(path)


def set_aside(root: Path, from_step: int) -> list[Path]:
    """Rename checkpoints of step >= ``from_step`` to ``.rolled-back-step_*``.

    They hold state from after a bad step, so a resume must not pick them; they are
    kept (under a name no scan matches) for inspection, not deleted. Rank 0 only.
    """
    moved = []
    for step, path in step_dirs(root):
        if step >= from_step:
            target = path.with_name(f".rolled-back-{path.name}")
            shutil.rmtree(target, ignore_errors=True)
            path.rename(target)
            moved.append(target)
    return moved
