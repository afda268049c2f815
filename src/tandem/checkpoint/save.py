"""Atomic checkpoint save: DCP shards into a temp dir, a manifest last, then one rename.

Protocol (all ranks call ``save``):

1. rank 0 checks ``meta`` and the root, creates ``root/.tmp-step_N-<token>`` and
   broadcasts its name, so a bad root fails on every rank before any data is written;
2. all ranks write their shards there with ``dcp.save`` (which coordinates them);
3. rank 0 hashes every file, writes ``manifest.json`` (fsync + os.replace), fsyncs the
   temp dir, renames it to ``root/step_N`` and fsyncs root, then applies retention;
4. rank 0 broadcasts the outcome, which is the barrier: no rank returns before the
   commit is visible, and a failed commit raises on every rank.

A crash at any point leaves either the old set of committed checkpoints or the old set
plus the new one; temp dirs are never read and are swept by the next save.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from tandem.checkpoint import _dist, layout, manifest
from tandem.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)


def save(root: Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int) -> Path:
    """Write one checkpoint of ``state`` atomically and return its directory.

    Must be called on all ranks (works without a process group too). ``meta`` must be
    JSON-serialisable; rank 0's copy is recorded. ``keep`` >= 1 keeps that many newest
    checkpoints, 0 keeps all. Raise ValueError for bad arguments and CheckpointError if
    the root is unusable or writing fails; earlier checkpoints are left intact.
    """
    _check_args(step, keep)
    root = Path(root)
    final = root / layout.step_name(step)
    shapes = manifest.tensor_shapes(state)
    tmp = _dist.on_rank_zero(lambda: _prepare(root, final.name, meta))
    try:
        with _dist.single_process_quiet():
            dcp.save(state, checkpoint_id=tmp, no_dist=not _dist.initialized())
    except (Exception, CheckpointException) as err:
        # CheckpointException is a BaseException: it must be named to be caught.
        if _dist.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"writing checkpoint step {step} into {tmp} failed: {err}") from err
    _dist.on_rank_zero(lambda: _commit(tmp, final, shapes, meta, keep))
    return final


def _check_args(step: int, keep: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be an int >= 0 (0 keeps all), got {keep!r}")


def _prepare(root: Path, name: str, meta: Any) -> Path:
    """Validate meta, create the temp dir and return it (rank 0 only)."""
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"meta must be JSON-serialisable (no NaN/inf): {err}") from err
    tmp = root / f"{layout.TMP_PREFIX}{name}-{uuid.uuid4().hex[:12]}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as err:
        raise CheckpointError(f"checkpoint directory {root} is not writable: {err}") from err
    return tmp


def _commit(tmp: Path, final: Path, shapes: dict[str, list[int]], meta: Any, keep: int) -> None:
    """Manifest, rename into place, retention (rank 0 only)."""
    step = int(final.name.removeprefix("step_"))
    aside = tmp.with_name(f"{tmp.name}-replaced")
    try:
        manifest.write(tmp, manifest.build(tmp, step, shapes, meta))
        if final.exists():
            # A directory cannot be renamed over a non-empty one; move the old one aside
            # and delete it only after the new one is committed.
            os.rename(final, aside)
        os.rename(tmp, final)
        manifest.fsync_dir(final.parent)
    except OSError as err:
        if aside.exists() and not final.exists():
            os.rename(aside, final)
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"committing checkpoint {final} failed: {err}") from err
    shutil.rmtree(aside, ignore_errors=True)
    logger.info("checkpoint committed: %s", final)
    try:
        layout.prune(final.parent, keep, final)
    except OSError as err:
        # The new checkpoint is safe; failing the step over housekeeping would be worse.
        logger.warning("checkpoint retention under %s failed: %s", final.parent, err)
