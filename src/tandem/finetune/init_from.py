"""`run.init_from`: a fresh run starts from trained weights.

The source is one of:

- a tandem run directory (its newest good checkpoint) or one checkpoint directory
  (`.../checkpoints/step_000000500`), from any world size and layout: its `model`
  section is loaded through DCP, which reshards, so each rank reads only what it holds
  (no full copy per rank under FSDP2);
- a safetensors file, or a folder of them (a sharded `model.safetensors.index.json`
  included): tensors are opened lazily, one key at a time, and only those the model
  has are read; each rank reads the full tensors and keeps its shard.

The loaded keys are matched to the model's parameter and buffer names: missing keys
(the model has, the source lacks), unexpected keys (the other way) and shape mismatches
are reported, and are an error unless `run.init_partial` allows them (a new head, for
instance: its weights keep their initialisation); LoRA adapters (`train.lora_rank`)
that the source lacks start as initialised without being reported. Only the weights are loaded, at a
fresh start; a run that resumes from its own checkpoint continues from that instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tandem.components.base import Component, RunParts

log = logging.getLogger(__name__)
INDEX = "model.safetensors.index.json"
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
    """'safetensors', 'checkpoint' (one checkpoint directory) or 'run' (a run directory);
    ValueError naming the setting `field` and what is allowed."""
    if not path.exists():
        raise ValueError(f"{field} {path}: no such file or directory")
    if path.is_file():
        if path.suffix == ".safetensors":
            return "safetensors"
    elif (path / "manifest.json").is_file():
        return "checkpoint"
    elif (path / "checkpoints").is_dir():
        return "run"
    elif (path / INDEX).is_file() or any(path.glob("*.safetensors")):
        return "safetensors"
    raise ValueError(f"{field} {path}: not a tandem run directory, a checkpoint "
                     "directory (with manifest.json), a .safetensors file or a folder of "
                     ".safetensors files")


class InitFrom(Component):
    """Loads `run.init_from` into the distributed model before the first step, at every
    start: the frozen parameters (`train.freeze`, LoRA's base) come from it again on a
    resume, so checkpoints leave them out."""

    restores_frozen = True

    def __init__(self, source: str, partial: bool = False, field: str = "run.init_from",
                 average: bool = False) -> None:
        self.source = Path(source).expanduser()
        self.partial, self.field = partial, field  # `field`: the setting errors name
        # From a checkpoint that holds a weight average (train.ema_decay): load the average,
        # the weights that run evaluated and returned, in place of the raw weights.
        self.average = average
        self.kind = kind_of(self.source, field)  # checked at once: before the model is built
        self.loaded: list[str] = []

    def setup(self, parts: RunParts) -> None:
        """Load the weights into the distributed model (every rank)."""
        self.load(parts.module)
        parts.weights_replaced()

    def load(self, module: nn.Module) -> None:
        """Load the source's weights into `module` (the user's module, or its shards).
        Every rank: a checkpoint source is read through DCP."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            set_model_state_dict,
        )

        own = get_model_state_dict(module)
        shapes = {k: list(v.shape) for k, v in own.items() if isinstance(v, torch.Tensor)}
        if self.kind == "safetensors":
            found = self._from_safetensors(module, shapes, set_model_state_dict,
                                           StateDictOptions)
        else:
            found = self._from_checkpoint(module, own, shapes)
        log.info("%s %s: loaded %d of the model's %d tensors%s", self.field, self.source,
                 len(self.loaded), len(shapes), f" ({found})" if found else "")

    def _from_safetensors(self, module: nn.Module, shapes: dict[str, list[int]],
                          set_state: Any, options: Any) -> str:
        safe_open = _safe_open()
        where = safetensors_files(self.source)
        source_shapes: dict[str, list[int]] = {}
        by_file: dict[Path, list[str]] = {}
        for name, file in where.items():
            by_file.setdefault(file, []).append(name)
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    source_shapes[name] = list(f.get_slice(name).get_shape())
        keys, problems = match(shapes, source_shapes)
        found = report(self.source, problems, self.partial, self.field)
        wanted = set(keys)
        tensors: dict[str, torch.Tensor] = {}
        for file, names in by_file.items():
            with safe_open(str(file), framework="pt") as f:
                for name in names:
                    if name in wanted:
                        tensors[name] = f.get_tensor(name)
        set_state(module, tensors, options=options(full_state_dict=True, strict=False))
        self.loaded = keys
        return found

    def _from_checkpoint(self, module: nn.Module, own: dict[str, Any],
                         shapes: dict[str, list[int]]) -> str:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

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
        keys, problems = match(shapes, source_shapes)
        found = report(path, problems, self.partial, self.field)
        subset = {k: own[k] for k in keys}
        prefix = "ema.weights."
        averaged = {k[len(prefix):] for k in saved if k.startswith(prefix)} & set(keys)
        if not self.average:
            averaged = set()
        wanted: dict[str, Any] = {"model": {k: v for k, v in subset.items()
                                            if k not in averaged}}
        if averaged:
            wanted["ema"] = {"weights": {k: subset[k] for k in averaged}}
        load(path, wanted, strict=False)  # DCP reshards into `subset`
        set_model_state_dict(module, subset, options=StateDictOptions(strict=False))
        self.loaded = keys
        return found
