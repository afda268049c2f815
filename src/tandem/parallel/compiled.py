"""torch.compile as a plan option, skipped with a warning where it cannot work."""

from __future__ import annotations

import logging
from functools import cache

import torch
from torch import nn

log = logging.getLogger("tandem")


@cache
def compile_problem(device_type: str) -> str | None:
    """Why torch.compile cannot work on this machine (None: it can), found by compiling and
    running a two-op function once: the same backend and compiler the model would need."""
    try:
        probe = torch.compile(lambda x: torch.relu(x) * 2.0)
        out = probe(torch.ones(4, device=device_type))
        if float(out.sum()) != 8.0:
            return "the compiled probe computed a wrong result"
    except Exception as err:  # noqa: BLE001 - any failure means: do not compile
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"{type(err).__name__}: {first[:200]}"
    return None


def maybe_compile(model: nn.Module, device: torch.device) -> bool:
    """Compile `model` in place (`nn.Module.compile`: parameter names unchanged) when the
    probe passes; otherwise warn and train eagerly. Returns whether it compiled."""
    problem = compile_problem(device.type)
    if problem is not None:
        log.warning("plan.compile: torch.compile cannot work here (%s); training eagerly",
                    problem)
        return False
    model.compile()
    return True
