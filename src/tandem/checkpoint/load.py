"""Finding the newest good checkpoint, and loading one into live state."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tandem.checkpoint import _dist, layout, manifest
from tandem.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

# Enough names to recognise the problem without drowning the message.
_MAX_NAMED = 20


def latest(root: Path, before: int | None = None) -> Path | None:
    """Return the newest committed checkpoint under ``root`` that verifies, or None.

    With ``before``, only checkpoints of a step < ``before`` count (a rollback to the
    state from before a bad step). Must be called on all ranks: rank 0 lists the
    candidates whose manifests and file sizes check out, then all ranks hash the
    newest one's files together (each a share) and agree; a candidate that fails moves
    the search to the next. Bad checkpoints are skipped with a warning that names the
    checkpoint and what is wrong.
    """
    return Path(found) if (found := scan(Path(root), before)[0]) is not None else None


def scan(root: Path, before: int | None = None) -> tuple[str | None, list[str]]:
    """(the newest good checkpoint or None, what was wrong with each newer one). All ranks."""
    listed = _dist.on_rank_zero(lambda: _candidates(root, before))
    problems = list(listed["problems"])
    for path in listed["paths"]:
        mine = _verify_share(Path(path))
        found = _dist.gather_problems(mine)
        if not found:
            return path, problems
        for problem in found:
            logger.warning("skipping bad checkpoint: %s", problem)
        problems += found
    return None, problems


def _candidates(root: Path, before: int | None) -> dict[str, list[str]]:
    try:
        dirs = layout.step_dirs(root)
    except OSError as err:
        raise CheckpointError(f"cannot list checkpoint directory {root}: {err}") from err
    paths, problems = [], []
    for step, path in dirs:
        if before is not None and step >= before:
            continue
        try:
            found = manifest.verify(path, hashes=False)
            if found["step"] != step:
                raise CheckpointError(f"{path}: manifest says step {found['step']}")
        except CheckpointError as err:
            logger.warning("skipping bad checkpoint: %s", err)
            problems.append(str(err))
            continue
        paths.append(str(path))
    return {"paths": paths, "problems": problems}


def _verify_share(path: Path) -> str | None:
    try:
        manifest.verify(path, hashes=True, share=(_dist.rank(), _dist.world_size()))
    except CheckpointError as err:
        return str(err)
    return None


def set_aside(root: Path, from_step: int, label: str = "rolled-back") -> list[str]:
    """Move checkpoints of step >= ``from_step`` out of the resume path (kept, renamed).

    Must be called on all ranks; rank 0 renames, every rank gets the new paths.
    """
    return _dist.on_rank_zero(
        lambda: [str(p) for p in layout.set_aside(Path(root), from_step, label)])


def read_meta(path: Path) -> dict[str, Any]:
    """Return the ``meta`` recorded in a checkpoint's manifest, without loading tensors."""
    return manifest.read(Path(path))["meta"]


def load(path: Path, state: dict[str, Any], strict: bool = True) -> dict[str, Any]:
    """Load a checkpoint's tensors into ``state`` in place and return its ``meta``.

    Must be called on all ranks when a process group exists; DCP reshards, so the
    checkpoint may come from any world size. Only the top-level sections present in
    ``state`` are loaded (``{"model": ...}`` alone loads a training checkpoint's
    weights). Raise ValueError naming missing, unexpected and shape-mismatched keys
    when the checkpoint does not fit ``state``, CheckpointError when it is unusable.
    ``strict=False`` loads a subset the caller has matched to the checkpoint already
    (keys it holds with their shapes): the checkpoint's other keys are not reported.
    """
    # Imported here: DCP imports DTensor, a large part of start-up, which a run
    # that never saves or loads a checkpoint should not pay.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from tandem.checkpoint.safe_read import SafeLoadPlanner, SafeReader

    path = Path(path)
    # Sizes only: latest() already hashed it, and hashing again doubles resume time;
    # but the metadata, the one file that is unpickled, is hashed right before reading.
    found = manifest.verify(path, hashes=False)
    manifest.verify_metadata(path, found)
    if strict:
        wanted = manifest.tensor_shapes(state)
        check_shapes(path, found["shapes"], wanted, _dist.union(set(wanted)))
    try:
        with _dist.single_process_quiet():
            dcp.load(state, storage_reader=SafeReader(path), planner=SafeLoadPlanner(),
                     no_dist=not _dist.initialized())
    except (Exception, CheckpointException) as err:
        # CheckpointException is a BaseException: it must be named to be caught.
        raise CheckpointError(f"loading checkpoint {path} failed: {err}") from err
    _dist.settle()
    return found["meta"]


def check_shapes(path: Path, saved: dict[str, list[int]], wanted: dict[str, list[int]],
                 held: set[str]) -> None:
    """Raise ValueError if the tensors of ``wanted`` do not match those ``saved``.

    Saved keys under top-level sections that ``wanted`` does not have are not loaded,
    so they are not reported as unexpected; nor are those another process holds
    (``held``: every process's keys; pipeline stages hold different parts).
    """
    sections = {key.split(".", 1)[0] for key in wanted}
    saved = {key: shape for key, shape in saved.items() if key.split(".", 1)[0] in sections}
    missing = sorted(wanted.keys() - saved.keys())
    unexpected = sorted(saved.keys() - held)
    mismatched = sorted(
        f"{key} (checkpoint {saved[key]}, state {wanted[key]})"
        for key in wanted.keys() & saved.keys()
        if list(saved[key]) != list(wanted[key])
    )
    problems = [
        f"{label}: {_names(keys)}"
        for label, keys in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatch", mismatched),
        )
        if keys
    ]
    if problems:
        raise ValueError(f"checkpoint {path} does not match the state: " + "; ".join(problems))


def _names(keys: list[str]) -> str:
    shown = ", ".join(keys[:_MAX_NAMED])
    extra = len(keys) - _MAX_NAMED
    return shown + (f", ... and {extra} more" if extra > 0 else "")
