"""Deferred initialisation: build on the meta device, shard, then initialise shard by shard.

A model larger than one process's memory cannot be built whole and then sharded. With
`plan.init = "deferred"` the model's parameters are created on the meta device (no
memory), the strategy shards or splits them, and only then each process allocates its
own part and fills it.

The values are defined module by module, independently of how the model is spread:
for every module that owns parameters (in `named_modules()` order) the RNG is seeded
from (run.seed, the module's qualified name) and the module's own `reset_parameters()`
initialises full-size copies of its parameters; each process keeps its shard of them.
The full copy of one module's parameters is the most that ever exists at once, and a
run at any process count, under any strategy, starts from the same weights.

Buffers keep the values the constructor gave them (they are created for real: they are
small, and a constructor may compute them, a causal mask for instance).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import torch
from torch import nn

from tandem.runtime import derive_seed, seed_all

_original_register = nn.Module.register_parameter


def _register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
    _original_register(module, name, param)
    if param is not None and param.device.type != "meta":
        module._parameters[name] = type(param)(param.to("meta"),
                                               requires_grad=param.requires_grad)


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Every parameter registered inside the context is moved to the meta device."""
    nn.Module.register_parameter = _register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = _original_register  # type: ignore[method-assign]


def build_on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """Run the model factory with its parameters on the meta device (buffers real)."""
    with _parameters_on_meta():
        return build()


def _reset_fn(module: nn.Module) -> Callable[[], None] | None:
    return getattr(module, "reset_parameters", None) or getattr(module, "_reset_parameters",
                                                                None)


def check_initialisable(model: nn.Module) -> None:
    """Raise ValueError naming each parameter whose module cannot initialise it."""
    missing = [f"{name}.{pname}" if name else pname
               for name, module in model.named_modules()
               for pname, _ in module.named_parameters(recurse=False)
               if _reset_fn(module) is None]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8
                                          else "")
        raise ValueError(
            f"plan.init: 'deferred' initialises each module's own parameters with its "
            f"reset_parameters(), and these parameters' modules have none: {shown}; give "
            "those modules a reset_parameters() that fills their own parameters, or use "
            "plan.init 'eager'")


def materialise(model: nn.Module, device: torch.device, seed: int) -> None:
    """Allocate this process's part of every meta parameter on `device` and initialise it.

    Must be called on all processes of a sharded model (each keeps its own shards; no
    communication is needed, every process computes the same full values).
    """
    check_initialisable(model)
    buffers = {name: b.detach().to(device, copy=True) for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, value in model.named_buffers():
            value.copy_(buffers[name])
        for name, module in model.named_modules():
            own = dict(module.named_parameters(recurse=False))
            if own:
                _initialise(module, own, derive_seed("init", seed, name), device)


def _initialise(module: nn.Module, own: dict[str, nn.Parameter], seed: int,
                device: torch.device) -> None:
    """Fill `module`'s own parameters from a seeded reset of full-size stand-ins."""
    full = {n: nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device=device),
                            requires_grad=p.requires_grad) for n, p in own.items()}
    module._parameters.update(full)
    try:
        seed_all(seed)
        reset = _reset_fn(module)
        assert reset is not None  # check_initialisable ran
        reset()
    finally:
        module._parameters.update(own)
    # Looked up, not imported (a large part of start-up): a parameter can only be a DTensor
    # once the strategy that sharded it has imported the module.
    dtensor = sys.modules.get("torch.distributed.tensor")
    for n, param in own.items():
        if dtensor is not None and isinstance(param, dtensor.DTensor):
            shard = dtensor.distribute_tensor(full[n].detach(), param.device_mesh, param.placements,
                                      src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            param.copy_(full[n].detach())
