"""Reading DCP checkpoints without arbitrary unpickling.

DCP stores its global metadata (`.metadata`) as a pickle and any non-tensor item as a
`torch.save` blob, and its stock reader loads both with full unpickling: a crafted
checkpoint could run code. tandem keeps non-tensor state out of DCP (see `codec`), reads
`.metadata` through an unpickler that builds only DCP's own metadata classes, torch
sizes and dtypes, and loads any byte item with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from tandem.checkpoint.errors import CheckpointError

_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED: dict[str, frozenset[str]] = {
    _METADATA_MODULE: frozenset({
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
        "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
        "_MEM_FORMAT_ENCODING"}),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class MetadataUnpickler(pickle.Unpickler):
    """Builds DCP metadata and nothing else: any other class is refused by name."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise CheckpointError(f"checkpoint metadata refers to {module}.{name}, which is not "
                              "part of DCP's metadata: refusing to unpickle it")


def read_metadata(path: Path) -> Metadata:
    """Parse a DCP `.metadata` file with `MetadataUnpickler`."""
    try:
        with open(path, "rb") as handle:
            metadata = MetadataUnpickler(handle).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path}: unreadable DCP metadata: {err}") from err
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{path}: holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeReader(FileSystemReader):
    """FileSystemReader whose metadata goes through `read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DefaultLoadPlanner that loads byte items with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                        loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
