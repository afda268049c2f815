"""The manifest: a JSON record of a checkpoint's files, checksums, tensor shapes and meta.

A checkpoint directory counts as committed only when its ``manifest.json`` parses and
every file it lists is present with the recorded size (and, when asked, hash). The
manifest is the last thing written, so its presence marks a finished save.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tandem.checkpoint.errors import CheckpointError

FORMAT = 1
MANIFEST = "manifest.json"
KEY_ENV = "TANDEM_CHECKPOINT_KEY"  # HMAC key: manifests are signed, and checked on load
# DCP's global metadata file; without it DCP cannot load any shard.
DCP_METADATA = ".metadata"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB chunks to bound memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_shapes(state: Mapping[str, Any], prefix: str = "") -> dict[str, list[int]]:
    """Return {dotted key: global shape} for every tensor in a nested dict/list state."""
    shapes: dict[str, list[int]] = {}
    items: Any = state.items() if isinstance(state, Mapping) else enumerate(state)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping | list | tuple):
            shapes.update(tensor_shapes(value, f"{name}."))
        elif isinstance(value, torch.Tensor):
            # DTensor and ShardedTensor are Tensor subclasses whose .shape is the global
            # shape, which is what must match across world sizes.
            shapes[name] = list(value.shape)
    return shapes


def list_files(directory: Path) -> list[str]:
    """Return the sorted posix paths of every regular file under ``directory``."""
    found = [
        path.relative_to(directory).as_posix()
        for path in directory.rglob("*")
        if path.is_file() and path.name != MANIFEST
    ]
    return sorted(found)


def build(directory: Path, step: int, shapes: dict[str, list[int]], meta: Any,
          lineage: str = "") -> dict[str, Any]:
    """Hash every file in ``directory`` and return the manifest document for it."""
    files = {}
    for name in list_files(directory):
        path = directory / name
        files[name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return document(step, files, shapes, meta, lineage)


def document(step: int, files: dict[str, dict[str, Any]], shapes: dict[str, list[int]],
             meta: Any, lineage: str = "") -> dict[str, Any]:
    """The manifest of a checkpoint whose files are already hashed, signed when a key is
    set (TANDEM_CHECKPOINT_KEY)."""
    doc = {
        "format": FORMAT,
        "step": step,
        "created": time.time(),
        "lineage": lineage,
        "files": dict(sorted(files.items())),
        "shapes": shapes,
        "meta": meta,
    }
    key = signing_key()
    if key is not None:
        doc["signature"] = signature(doc, key)
    return doc


def signing_key() -> bytes | None:
    """The HMAC key from the environment (None: checkpoints are not signed)."""
    value = os.environ.get(KEY_ENV, "")
    return value.encode() if value else None


def signature(doc: dict[str, Any], key: bytes) -> str:
    """HMAC-SHA256 of the manifest's canonical JSON (without its signature)."""
    body = {k: v for k, v in doc.items() if k != "signature"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def check_signature(path: Path, doc: dict[str, Any]) -> None:
    """With a key set, refuse a manifest that is unsigned or signed with another key."""
    key = signing_key()
    if key is None:
        return
    found = doc.get("signature")
    if not isinstance(found, str):
        raise CheckpointError(f"{path}: the manifest is not signed, and {KEY_ENV} is set: "
                              "refusing an unsigned checkpoint")
    if not hmac.compare_digest(found, signature(doc, key)):
        raise CheckpointError(f"{path}: the manifest's signature does not match "
                              f"{KEY_ENV}: it was changed, or signed with another key")


def write(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` durably: temp file, fsync, atomic replace, fsync the dir."""
    final = directory / MANIFEST
    temp = directory / f"{MANIFEST}.tmp"
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True, allow_nan=False)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, final)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry so a rename or create inside it survives a crash."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(directory: Path) -> dict[str, Any]:
    """Parse and shape-check ``directory/manifest.json``; raise CheckpointError if unusable."""
    path = directory / MANIFEST
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: missing manifest {MANIFEST}") from None
    except OSError as err:
        raise CheckpointError(f"{path}: cannot read manifest: {err}") from err
    try:
        manifest = json.loads(text)
    except ValueError as err:
        raise CheckpointError(f"{path}: unreadable JSON: {err}") from err
    _check_structure(path, manifest)
    check_signature(path, manifest)
    return manifest


def _check_structure(path: Path, manifest: Any) -> None:
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: manifest is not a JSON object")
    if manifest.get("format") != FORMAT:
        raise CheckpointError(
            f"{path}: unsupported manifest format {manifest.get('format')!r}, expected {FORMAT}"
        )
    for key, kind in (("step", int), ("files", dict), ("shapes", dict)):
        if not isinstance(manifest.get(key), kind):
            raise CheckpointError(f"{path}: manifest field {key!r} missing or not {kind.__name__}")
    if "meta" not in manifest:
        raise CheckpointError(f"{path}: manifest field 'meta' missing")
    for name, entry in manifest["files"].items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            raise CheckpointError(f"{path}: malformed entry for file {name!r}")


def verify(directory: Path, *, hashes: bool = True,
           share: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """Return the manifest if every listed file exists with its size (and hash).

    ``hashes=False`` checks only presence and sizes: a stat per file, cheap enough to
    run on every load and every retention pass. ``share=(rank, world)`` hashes only
    every world-th file from the rank-th on (sorted by name), so that ranks can verify
    one checkpoint together. Raise CheckpointError naming the checkpoint, the file and
    what is wrong.
    """
    manifest = read(directory)
    files = manifest["files"]
    if DCP_METADATA not in files:
        raise CheckpointError(f"{directory}: manifest does not list DCP {DCP_METADATA}")
    rank, world = share
    for index, (name, entry) in enumerate(sorted(files.items())):
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{directory}: missing file {name}") from None
        except OSError as err:
            raise CheckpointError(f"{directory}: cannot stat {name}: {err}") from err
        if size != entry["bytes"]:
            raise CheckpointError(
                f"{directory}: size mismatch for {name}: {size} bytes, "
                f"manifest says {entry['bytes']}"
            )
        mine = index % world == rank
        if hashes and mine and _hash_or_raise(directory, name) != entry["sha256"]:
            raise CheckpointError(f"{directory}: checksum mismatch for {name}")
    return manifest


def verify_metadata(directory: Path, manifest: dict[str, Any]) -> None:
    """Hash DCP's metadata file right before it is read: it is the one file that is
    unpickled (restricted), so it must be the file the (signed) manifest lists."""
    if _hash_or_raise(directory, DCP_METADATA) != manifest["files"][DCP_METADATA]["sha256"]:
        raise CheckpointError(f"{directory}: checksum mismatch for {DCP_METADATA}")


def _hash_or_raise(directory: Path, name: str) -> str:
    try:
        return sha256_file(directory / name)
    except OSError as err:
        raise CheckpointError(f"{directory}: cannot read {name}: {err}") from err
