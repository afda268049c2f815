"""Pipeline stages: the model cut into contiguous parts that keep their parameter names.

A model is cut along its units: the blocks of its block list (`find_blocks`' container)
and the parts around it (embeddings before, norm and head after; the root's own
parameters go with the first part). Each stage is a shell of the user's module: a copy
of its module objects along the way to the kept units, sharing their parameters, with
every unit it does not hold set to None (a block list keeps only its blocks, under their
own indices). Names are those of the whole model (`blocks.2.attn.q.weight`), so a
checkpoint moves between a pipeline and one process. The model's forward must skip the
parts that are None (`if self.embed is not None: ...`), as in torchtitan.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from torch import nn

from tandem.parallel.blocks import find_blocks


def _container_path(model: nn.Module) -> str:
    """The name of the module holding the model's blocks ("" for the root)."""
    blocks = find_blocks(model)
    if not blocks:
        raise ValueError("plan.pp: the model has no block list to cut into stages (an "
                         "nn.ModuleList or nn.Sequential of several layers); give the "
                         "stages' units in plan.pp_split")
    first = blocks[0]
    for name, module in model.named_modules():
        if any(child is first for child in module.children()):
            return name
    raise AssertionError("a found block has no parent")


def units(model: nn.Module) -> tuple[list[str], list[str], list[str]]:
    """The model's units in forward order: (before the blocks, the blocks, after them).

    The root's and the path modules' own parameters and buffers count as before."""
    path = _container_path(model)
    parts = path.split(".") if path else []
    before: list[str] = []
    after: list[str] = []
    blocks: list[str] = []
    module, prefix = model, ""
    for depth in range(len(parts) + 1):
        before += [prefix + n for n, p in module._parameters.items() if p is not None]
        before += [prefix + n for n, b in module._buffers.items() if b is not None]
        if depth == len(parts):
            blocks = [prefix + n for n, m in module._modules.items() if m is not None]
            break
        seen = False
        for name, child in module._modules.items():
            if child is None:
                continue
            if name == parts[depth]:
                seen = True
            elif seen:
                after.append(prefix + name)
            else:
                before.append(prefix + name)
        module, prefix = module._modules[parts[depth]], prefix + parts[depth] + "."
    return before, blocks, after


def auto_split(model: nn.Module, stages: int) -> list[list[str]]:
    """Units per stage: the blocks spread as evenly as possible, the parts before them
    with the first stage and after them with the last, each counted as one layer."""
    before, blocks, after = units(model)
    items = [before] if before else []
    for b in blocks:  # a layer without parameters (an activation) goes with the one before
        if items and not any(True for _ in model.get_submodule(b).parameters()):
            items[-1].append(b)
        else:
            items.append([b])
    blocks = [b for b in blocks if any(True for _ in model.get_submodule(b).parameters())]
    items += [after] if after else []
    if len(items) < stages:
        raise ValueError(f"plan.pp: {stages} stages, but the model has only {len(blocks)} "
                         f"blocks (+{len(items) - len(blocks)} parts around them): a stage "
                         "would be empty; use fewer stages (plan.pp x plan.pp_virtual)")
    size, extra = divmod(len(items), stages)
    out, start = [], 0
    for k in range(stages):
        stop = start + size + (1 if k < extra else 0)
        out.append([u for item in items[start:stop] for u in item])
        start = stop
    return out


def parse_split(text: str, model: nn.Module, stages: int) -> list[list[str]]:
    """`plan.pp_split` ("embed,pos,blocks.0|blocks.1,norm,head") as units per stage,
    checked: every unit in exactly one stage, none empty, `stages` of them."""
    split = [[u.strip() for u in part.split(",") if u.strip()] for part in text.split("|")]
    before, blocks, after = units(model)
    allowed = before + blocks + after
    if len(split) != stages:
        raise ValueError(f"plan.pp_split: {len(split)} stages given ('|'-separated), the plan "
                         f"has {stages} (plan.pp x plan.pp_virtual)")
    for k, part in enumerate(split):
        if not part:
            raise ValueError(f"plan.pp_split: stage {k} is empty; every stage needs a unit")
    named = [u for part in split for u in part]
    unknown = sorted(set(named) - set(allowed))
    twice = sorted({u for u in named if named.count(u) > 1})
    missing = [u for u in allowed if u not in named]
    if unknown or twice or missing:
        raise ValueError(
            f"plan.pp_split: every unit in exactly one stage; unknown {unknown}, named twice "
            f"{twice}, missing {missing}; the units are {', '.join(allowed)}")
    return split


def shell(model: nn.Module, keep: Sequence[str]) -> nn.Module:
    """The model holding only the units `keep` (their parameters shared, not copied);
    every other unit is None, and a block list keeps its kept blocks' own indices."""
    kept = set(keep)
    before, blocks, after = units(model)
    every = before + blocks + after
    copies: dict[str, nn.Module] = {}

    def copied(path: str) -> nn.Module:
        if path not in copies:
            source = model.get_submodule(path)
            twin = copy.copy(source)
            twin._modules = dict(source._modules)
            twin._parameters = dict(source._parameters)
            twin._buffers = dict(source._buffers)
            copies[path] = twin
            if path:
                parent, _, name = path.rpartition(".")
                copied(parent)._modules[name] = twin
        return copies[path]

    root = copied("")
    for unit in every:
        if unit in kept:
            continue
        parent, _, name = unit.rpartition(".")
        owner = copied(parent)
        if name in owner._parameters:
            owner._parameters[name] = None
        elif name in owner._buffers:
            owner._buffers[name] = None
        elif unit in blocks:
            del owner._modules[name]  # the block list keeps the other indices
        else:
            owner._modules[name] = None
    return root
