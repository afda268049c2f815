"""`run.init_from`: a fresh run starts from trained weights.

The source is one of:

- a tandem run directory (its newest good checkpoint) or one checkpoint directory
  (`.../checkpoints/step_000000500`), from any world size and layout: its `model`
  section is loaded through DCP, which reshards, so each rank reads only what it holds
  (no full copy per rank under FSDP2);
- a DCP directory written by `torch.distributed.checkpoint.save` outside tandem (its
  `.metadata` beside the shards): the model's state dict saved alone or as the `model`
  entry of a larger dict (other nestings through `Task.map_weights`, which sees the keys
  as DCP joined them: `app.model.0.weight`); DCP reshards it like a tandem checkpoint;
- a safetensors file, or a folder of them (a sharded `model.safetensors.index.json`
  included): tensors are opened lazily, one key at a time, and only those the model
  has are read; each rank reads only the block of each tensor it holds (its FSDP2 or
  tensor-parallel shard, `finetune.shard_read`), so no rank holds a full copy of a
  sharded model; a plain (one-process, DDP) model reads whole tensors.

`Task.map_weights` (name -> the model's name, or None to drop the key) renames the
source's keys first, so weights saved under another library's names load. The loaded keys
are matched to the model's parameter and buffer names: missing keys
(the model has, the source lacks), unexpected keys (the other way) and shape mismatches
are reported, and are an error unless `run.init_partial` allows them (a new head, for
instance: its weights keep their initialisation); LoRA adapters (`train.lora_rank`)
that the source lacks start as initialised without being reported. Only the weights
are loaded, at a fresh start; a run that resumes from its own checkpoint continues from
that instead.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tandem.components.base import Component, RunParts

log = logging.getLogger(__name__)
INDEX = "model.safetensors.index.json"
MapWeights = Callable[[str], str | None]
# What reads the chosen keys (the model's name -> the source's) into the model.
Reader = Callable[[nn.Module, dict[str, Any], dict[str, str]], None]
_SHOWN = 12


def _names(keys: list[str]) -> str:
    return ", ".join(keys[:_SHOWN]) + (f", ... and {len(keys) - _SHOWN} more"
                                       if len(keys) > _SHOWN else "")


def match(model_shapes: dict[str, list[int]], source_shapes: dict[str, list[int]]
          ) -> tuple[list[str], dict[str, list[str]]]:
    """(keys to load, {'missing', 'unexpected', 'shape mismatch': keys})."""
    # LoRA adapters a base model never had start as initialised (B = 0: the base model)
    missing = sorted(k for k in model_shapes.keys() - source_shapes.keys()
                     if ".lora_A." not in k and ".lora_B." not in k)
    unexpected = sorted(source_shapes.keys() - model_shapes.keys())
    both = model_shapes.keys() & source_shapes.keys()
    mismatched = sorted(f"{k} (source {source_shapes[k]}, model {model_shapes[k]})"
                        for k in both if list(source_shapes[k]) != list(model_shapes[k]))
    bad = {k.split(" ", 1)[0] for k in mismatched}
    return sorted(both - bad), {"missing": missing, "unexpected": unexpected,
                                "shape mismatch": mismatched}


def rename(source_keys: Iterable[str], map_weights: MapWeights | None) -> dict[str, str]:
    """{the model's name: the source's key}: each key through `map_weights` (None: keys as
    they are; a key it maps to None is left out). ValueError for a name that is not a str
    and for two keys mapped to one name."""
    out: dict[str, str] = {}
    for key in source_keys:
        name = key if map_weights is None else map_weights(key)
        if name is None:
            continue
        if not isinstance(name, str):
            raise ValueError(f"Task.map_weights({key!r}) returned {name!r}: it must return "
                             "the model's name for the key (a str) or None to leave it out")
        if name in out:
            raise ValueError(f"Task.map_weights maps both {out[name]!r} and {key!r} to "
                             f"{name!r}: each of the model's names can take one key")
        out[name] = key
    return out


def report(source: Path, problems: dict[str, list[str]], partial: bool,
           field: str = "run.init_from") -> str:
    """'' when the source fits the model; else what does not, or a ValueError (naming the
    setting `field`) when `partial` is off."""
    found = "; ".join(f"{label} keys: {_names(keys)}" if label != "shape mismatch"
                      else f"shape mismatch: {_names(keys)}"
                      for label, keys in problems.items() if keys)
    if found and not partial:
        hint = (". Set run.init_partial true to load the keys that match and keep the "
                "others as initialised (e.g. a new head)") if field == "run.init_from" else ""
        raise ValueError(f"{field} {source}: the weights do not match the model: "
                         f"{found}{hint}")
    return found


def _safe_open() -> Any:
    try:
        from safetensors import safe_open
    except ImportError:
        raise ValueError("a .safetensors source of weights needs the safetensors package: "
                         "pip install 'tandem[finetune]' (or safetensors)") from None
    return safe_open


def safetensors_files(path: Path) -> dict[str, Path]:
    """{tensor name: file} of a safetensors file or folder (its index when it has one)."""
    if path.is_file():
        files = [path]
    elif (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text(encoding="utf-8"))["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    else:
        files = sorted(path.glob("*.safetensors"))
    safe_open = _safe_open()
    out: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            out.update({name: file for name in f.keys()})
    return out


def kind_of(path: Path, field: str = "run.init_from") -> str:
    """'safetensors', 'checkpoint' (one checkpoint directory), 'run' (a run directory) or
    'dcp' (a DCP directory of another writer); ValueError naming the setting `field` and
    what is allowed."""
    if not path.exists():
        raise ValueError(f"{field} {path}: no such file or directory")
    if path.is_file():
        if path.suffix == ".safetensors":
            return "safetensors"
    elif (path / "manifest.json").is_file():
        return "checkpoint"
    elif (path / "checkpoints").is_dir():
        return "run"
    elif (path / ".metadata").is_file():
        return "dcp"
    elif (path / INDEX).is_file() or any(path.glob("*.safetensors")):
        return "safetensors"
    raise ValueError(f"{field} {path}: not a tandem run directory, a checkpoint "
                     "directory (with manifest.json), a DCP directory (with .metadata), a "
                     ".safetensors file or a folder of .safetensors files")


class InitFrom(Component):
    """Loads `run.init_from` into the distributed model before the first step, at every
    start: the frozen parameters (`train.freeze`, LoRA's base) come from it again on a
    resume, so checkpoints leave them out."""

    restores_frozen = True

    def __init__(self, source: str, partial: bool = False, field: str = "run.init_from",
                 average: bool = False, map_weights: MapWeights | None = None) -> None:
        self.source = Path(source).expanduser()
        self.partial, self.field = partial, field  # `field`: the setting errors name
        # From a checkpoint that holds a weight average (train.ema_decay): load the average,
        # the weights that run evaluated and returned, in place of the raw weights.
        self.average = average
        self.map_weights = map_weights
        self.kind = kind_of(self.source, field)  # checked at once: before the model is built
        self.loaded: list[str] = []
        self.bytes_read = 0  # from a safetensors source, by this rank
        self.whole: dict[str, list[int]] = {}  # the whole model's {name: shape}

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Note the whole model's names and shapes, before a plan cuts it into stages."""
        self.whole = {k: list(v.shape) for k, v in model.state_dict().items()
                      if isinstance(v, torch.Tensor)}
        return model

    def setup(self, parts: RunParts) -> None:
        """Load the weights into the distributed model (every rank)."""
        self.load(parts.module)
        parts.weights_replaced()

    def load(self, module: nn.Module) -> None:
        """Load the source's weights into `module` (the user's module, or its shards).
        Every rank: a checkpoint source is read through DCP."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        own = get_model_state_dict(module)
        held = {k: list(v.shape) for k, v in own.items() if isinstance(v, torch.Tensor)}
        # Matched against the whole model: a pipeline stage holds only its own part
        shapes = self.whole or held
        opened = {"safetensors": self._safetensors, "dcp": self._dcp}.get(
            self.kind, self._checkpoint)
        path, source_shapes, read = opened(shapes)
        names = rename(source_shapes, self.map_weights)
        keys, problems = match(shapes, {n: source_shapes[k] for n, k in names.items()})
        found = report(path, problems, self.partial, self.field)
        read(module, own, {k: names[k] for k in keys if k in held})
        self.loaded = keys
        log.info("%s %s: loaded %d of the model's %d tensors%s", self.field, self.source,
                 len(self.loaded), len(shapes), f" ({found})" if found else "")

    def _safetensors(self, shapes: dict[str, list[int]]
                     ) -> tuple[Path, dict[str, list[int]], Reader]:
        safe_open = _safe_open()
        by_file: dict[Path, list[str]] = {}
        for name, file in safetensors_files(self.source).items():
            by_file.setdefault(file, []).append(name)
        source_shapes: dict[str, list[int]] = {}
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    source_shapes[name] = list(f.get_slice(name).get_shape())

        def read(module: nn.Module, own: dict[str, Any], pairs: dict[str, str]) -> None:
            from tandem.finetune.shard_read import read_into

            model_name = {key: name for name, key in pairs.items()}
            self.bytes_read = 0
            for file, keys in by_file.items():
                with safe_open(str(file), framework="pt") as f:
                    for key in keys:
                        if key in model_name:  # this rank's block of it only
                            self.bytes_read += read_into(f, key, own[model_name[key]])
            _set(module, {k: own[k] for k in pairs})

        return self.source, source_shapes, read

    def _checkpoint(self, shapes: dict[str, list[int]]
                    ) -> tuple[Path, dict[str, list[int]], Reader]:
        from tandem.checkpoint import manifest
        from tandem.checkpoint.load import latest, load

        path = self.source
        if self.kind == "run":
            found_path = latest(path / "checkpoints")
            if found_path is None:
                raise ValueError(f"{self.field} {path}: the run has no good checkpoint "
                                 f"under {path / 'checkpoints'}")
            path = found_path
        saved = manifest.read(path)["shapes"]
        source_shapes = {k[len("model."):]: v for k, v in saved.items()
                         if k.startswith("model.")}
        if not source_shapes:
            raise ValueError(f"{self.field} {path}: the checkpoint holds no model weights")

        def read(module: nn.Module, own: dict[str, Any], pairs: dict[str, str]) -> None:
            prefix = "ema.weights."
            averaged = {k for k, key in pairs.items()
                        if self.average and prefix + key in saved}
            wanted: dict[str, Any] = {"model": {pairs[k]: own[k] for k in pairs
                                                if k not in averaged}}
            if averaged:
                wanted["ema"] = {"weights": {pairs[k]: own[k] for k in averaged}}
            load(path, wanted, strict=False)  # DCP reshards into the model's own tensors
            _set(module, {k: own[k] for k in pairs})

        return path, source_shapes, read

    def _dcp(self, shapes: dict[str, list[int]]
             ) -> tuple[Path, dict[str, list[int]], Reader]:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from tandem.checkpoint.safe_read import read_metadata

        entries = read_metadata(self.source / ".metadata").state_dict_metadata
        tensors = {k: list(m.size) for k, m in entries.items()
                   if isinstance(m, TensorStorageMetadata)}
        # Without a map: the model's state dict alone, or under "model" beside other state
        # (an optimizer's), whichever names more of the model's keys. A map sees the keys
        # as written (DCP joins nested names with dots).
        section = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
        prefix, source_shapes = "", tensors
        if self.map_weights is None and (len(section.keys() & shapes.keys())
                                         > len(tensors.keys() & shapes.keys())):
            prefix, source_shapes = "model.", section
        if not source_shapes:
            raise ValueError(f"{self.field} {self.source}: the DCP checkpoint holds no tensors")

        def read(module: nn.Module, own: dict[str, Any], pairs: dict[str, str]) -> None:
            import torch.distributed.checkpoint as dcp

            from tandem.checkpoint import _dist
            from tandem.checkpoint.safe_read import SafeLoadPlanner, SafeReader

            # Flat keys are the checkpoint's own: DCP flattens nested dicts with dots.
            with _dist.single_process_quiet():
                dcp.load({prefix + key: own[k] for k, key in pairs.items()},
                         storage_reader=SafeReader(self.source), planner=SafeLoadPlanner(),
                         no_dist=not _dist.initialized())
            _set(module, {k: own[k] for k in pairs})

        return self.source, source_shapes, read


def _set(module: nn.Module, tensors: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, tensors, options=StateDictOptions(strict=False))
