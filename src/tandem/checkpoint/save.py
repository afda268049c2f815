"""Atomic checkpoint save: DCP shards into a temp dir, a manifest last, then one rename.

Protocol, in three parts that the synchronous `save` runs in a row and the
CheckpointManager runs in a background thread:

1. `prepare_tmp`: the temp dir `root/.tmp-step_N-<token>` (every rank may create it;
   the token is agreed beforehand, so no collective is needed);
2. `write_shards` (all ranks): DCP writes every rank's shards; then each rank hashes the
   files it wrote itself, so hashing is spread over the ranks;
3. `commit` (rank 0, with every rank's file records): the manifest (fsync + os.replace),
   a rename of the temp dir to `root/step_N`, an fsync of root, then retention.

A crash at any point leaves either the old set of committed checkpoints or the old set
plus the new one; temp dirs are never read and are swept by the next commit.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tandem.checkpoint import _dist, layout, manifest
from tandem.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

Files = dict[str, dict[str, Any]]  # name -> {"bytes": n, "sha256": hex}


def save(root: Path, step: int, state: dict[str, Any], meta: dict[str, Any], keep: int,
         lineage: str = "") -> Path:
    """Write one checkpoint of ``state`` atomically and return its directory.

    Must be called on all ranks (works without a process group too). ``meta`` must be
    JSON-serialisable; rank 0's copy is recorded. ``keep`` >= 1 keeps that many newest
    checkpoints of this ``lineage``, 0 keeps all. Raise ValueError for bad arguments and
    CheckpointError if the root is unusable or writing fails; earlier checkpoints are
    left intact.
    """
    check_args(step, keep, meta)
    root = Path(root)
    token = _dist.broadcast_from_zero(uuid.uuid4().hex[:12])
    tmp = _dist.on_rank_zero(lambda: prepare_tmp(root, step, token))
    try:
        files = write_shards(tmp, state, None)
    except CheckpointError:
        if _dist.rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    everyone, shapes = gather_files(files, None, manifest.tensor_shapes(state))
    final = root / layout.step_name(step)
    _dist.on_rank_zero(lambda: commit(tmp, final, everyone, shapes, meta, keep, lineage))
    return final


def check_args(step: int, keep: int, meta: Any) -> None:
    """Raise ValueError for a bad step, keep or meta."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be an int >= 0 (0 keeps all), got {keep!r}")
    if not isinstance(meta, dict):
        raise ValueError(f"meta must be a dict, got {type(meta).__name__}")
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"meta must be JSON-serialisable (no NaN/inf): {err}") from err


def tmp_dir(root: Path, step: int, token: str) -> Path:
    """The temp dir a save of `step` writes into before its commit."""
    return Path(root) / f"{layout.TMP_PREFIX}{layout.step_name(step)}-{token}"


def prepare_tmp(root: Path, step: int, token: str) -> Path:
    """Create (or find) the temp dir of a save and return it."""
    tmp = tmp_dir(root, step, token)
    try:
        tmp.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CheckpointError(f"checkpoint directory {root} is not writable: {err}") from err
    return tmp


def write_shards(tmp: Path, state: dict[str, Any],
                 group: dist.ProcessGroup | None) -> Files:
    """Write this rank's part of ``state`` with DCP, then hash the files this rank wrote.

    Must be called on all ranks of ``group`` (the default group when None).
    """
    # Imported here: DCP imports DTensor, a large part of start-up, which a run
    # that never saves or loads a checkpoint should not pay.
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _dist.single_process_quiet():
            dcp.save(state, checkpoint_id=tmp, process_group=group,
                     no_dist=not _dist.initialized())
    except (Exception, CheckpointException) as err:
        # CheckpointException is a BaseException: it must be named to be caught.
        raise CheckpointError(f"writing checkpoint into {tmp} failed: {err}") from err
    return hash_own_files(tmp, _dist.rank())


def hash_own_files(directory: Path, rank: int) -> Files:
    """Size and sha256 of the files `rank` wrote (its DCP shards; rank 0: the metadata)."""
    prefix = f"__{rank}_"
    names = [name for name in manifest.list_files(directory)
             if name.startswith(prefix) or (rank == 0 and not name.startswith("__"))]
    files: Files = {}
    for name in names:
        path = directory / name
        try:
            files[name] = {"bytes": path.stat().st_size, "sha256": manifest.sha256_file(path)}
        except OSError as err:
            raise CheckpointError(f"cannot read back {path}: {err}") from err
    return files


def gather_files(files: Files, group: dist.ProcessGroup | None,
                 shapes: dict[str, list[int]]) -> tuple[Files, dict[str, list[int]]]:
    """Every rank's file records and tensor shapes, merged on rank 0 (others get theirs
    back): ranks may hold different tensors (pipeline stages). All ranks."""
    if not _dist.initialized():
        return files, shapes
    box: list[Any] = [None] * dist.get_world_size(group) if _dist.rank() == 0 else []
    dist.gather_object((files, shapes), box if _dist.rank() == 0 else None, dst=0,
                       group=group)
    if _dist.rank() != 0:
        return files, shapes
    merged: Files = {}
    every: dict[str, list[int]] = {}
    for part, part_shapes in box:
        merged.update(part)
        every.update(part_shapes)
    return merged, every


def commit(tmp: Path, final: Path, files: Files, shapes: dict[str, list[int]], meta: Any,
           keep: int, lineage: str = "") -> None:
    """Manifest, rename into place, retention (rank 0 only)."""
    step = int(final.name.removeprefix("step_"))
    aside = tmp.with_name(f"{tmp.name}-replaced")
    try:
        manifest.write(tmp, manifest.document(step, files, shapes, meta, lineage))
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
        layout.prune(final.parent, keep, final, lineage)
    except OSError as err:
        # The new checkpoint is safe; failing the step over housekeeping would be worse.
        logger.warning("checkpoint retention under %s failed: %s", final.parent, err)
