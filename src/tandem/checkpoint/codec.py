"""Split a state into tensors (for DCP) and plain values (for JSON), and join them again.

DCP pickles whatever in a state dict is not a tensor, and unpickles it on load. tandem
keeps those values (an optimizer's param_groups, a loss scaler's counters, the data
cursor) out of DCP: they go into the checkpoint's JSON manifest, so loading a
checkpoint unpickles nothing but DCP's own metadata (through a restricted unpickler).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

_TENSOR, _MAP, _SEQ, _FLOAT = "__tensor__", "__map__", "__seq__", "__float__"


def split(state: Any, where: str = "state") -> tuple[Any, Any]:
    """(tensors, plain values): the same nesting, each side holding only its own leaves.

    Dicts, lists and tuples are walked. The tensor side is a tree of str-keyed dicts
    (None where a branch holds no tensor); the plain side is JSON-ready and records
    every key, its type and the container kinds, so `join` rebuilds the state exactly.
    Raise ValueError naming the path of a leaf that is neither a tensor nor plain.
    """
    if isinstance(state, torch.Tensor):
        return state, {_TENSOR: 1}
    if isinstance(state, Mapping):
        tensors: dict[str, Any] = {}
        entries = []
        for key, value in state.items():
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ValueError(f"{where}: key {key!r} is not a str or int")
            t, p = split(value, f"{where}.{key}")
            if t is not None:
                tensors[str(key)] = t
            entries.append([type(key).__name__, str(key), p])
        return (tensors or None), {_MAP: entries}
    if isinstance(state, list | tuple):
        parts = [split(v, f"{where}[{i}]") for i, v in enumerate(state)]
        found = {str(i): t for i, (t, _) in enumerate(parts) if t is not None}
        kind = "tuple" if isinstance(state, tuple) else "list"
        return (found or None), {_SEQ: kind, "items": [p for _, p in parts]}
    return None, _plain(state, where)


def _plain(value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {_FLOAT: repr(value)}
    raise ValueError(f"{where}: a {type(value).__name__} is neither a tensor nor a plain "
                     "value (None, bool, int, float, str, list, tuple, dict) and cannot be "
                     "checkpointed")


def join(tensors: Any, plain: Any) -> Any:
    """The state `split` took apart.

    The plain side is the first process's; processes may hold other tensors (pipeline
    stages), so a mapping keeps the tensors loaded for this process: a tensor leaf the
    plain side names but this process did not load is left out, and a loaded tensor it
    does not name is kept."""
    if not isinstance(plain, dict):
        return plain
    if _TENSOR in plain:
        return tensors
    if _FLOAT in plain:
        return float(plain[_FLOAT])
    found = tensors or {}
    if _MAP in plain:
        out = {(int(key) if kind == "int" else key): join(found.get(key), p)
               for kind, key, p in plain[_MAP]
               if key in found or not (isinstance(p, dict) and _TENSOR in p)}
        named = {key for _, key, _ in plain[_MAP]}
        out.update({key: value for key, value in found.items() if key not in named})
        return out
    items = [join(found.get(str(i)), p) for i, p in enumerate(plain["items"])]
    return tuple(items) if plain[_SEQ] == "tuple" else items
