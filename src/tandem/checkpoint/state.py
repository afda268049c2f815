"""Capture and restore model + optimizer state in the form DCP saves and reshards.

DCP's `state_dict` helpers are imported on first use, not with this module: they import
DTensor, a large part of start-up, which a run that never takes a state should not pay.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from torch import nn
from torch.optim import Optimizer


def _dcp_state() -> ModuleType:
    """DCP's `torch.distributed.checkpoint.state_dict` module, imported on first use."""
    import torch.distributed.checkpoint.state_dict as dcp_state

    return dcp_state


def capture(model: nn.Module, optimizer: Optimizer) -> dict[str, Any]:
    """Return ``{"model": ..., "optim": ...}`` for a plain, DDP or FSDP2 model.

    Keys are the unwrapped module's names (no ``module.`` prefix from DDP), so a
    checkpoint moves between wrappings. Must be called on all ranks for FSDP2. On a
    fresh optimizer this creates its state with a zero-gradient, zero-lr step, so call
    it before the first backward when capturing a target to load into.
    """
    model_state, optim_state = _dcp_state().get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def restore(model: nn.Module, optimizer: Optimizer, state: dict[str, Any]) -> None:
    """Copy a loaded ``{"model": ..., "optim": ...}`` state into the model and optimizer."""
    for key in ("model", "optim"):
        if key not in state:
            raise ValueError(f"state must have a {key!r} entry, got keys {sorted(state)}")
    _dcp_state().set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )


class ModelWeights:
    """The model's weights as a Stateful (section "model": unwrapped names).

    `skip_frozen`: leave out the parameters that take no gradient (frozen or LoRA's base
    weights, which the run reloads from `run.init_from` at every start): a checkpoint
    then holds the trained parameters and the buffers only."""

    def __init__(self, model: nn.Module, skip_frozen: bool = False) -> None:
        self.model, self.skip_frozen = model, skip_frozen

    def state_dict(self) -> dict[str, Any]:
        """The weights; DTensor shards stay shards (DCP reshards them)."""
        state = _dcp_state().get_model_state_dict(self.model)
        if self.skip_frozen:
            # every name of a shared (tied) parameter: the state dict holds each
            frozen = {name.removeprefix("module.") for name, p in
                      self.model.named_parameters(remove_duplicate=False)
                      if not p.requires_grad}
            state = {k: v for k, v in state.items() if k not in frozen}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy loaded weights in."""
        dcp_state = _dcp_state()
        dcp_state.set_model_state_dict(self.model, state, options=dcp_state.StateDictOptions(
            strict=not self.skip_frozen))


class OptimizerState:
    """The optimizer's state as a Stateful (section "optim", keyed by parameter names)."""

    def __init__(self, model: nn.Module, optimizer: Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        """Moments and step counts by parameter name, and the param groups. On a fresh
        optimizer this creates its state with a zero-gradient, zero-lr step."""
        return _dcp_state().get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy loaded optimizer state in.

        Each group's parameter names are this process's own: a checkpoint written by
        another layout (pipeline stages hold other parameters, and the groups are
        recorded once, by the first process) names others. The per-parameter state is
        loaded by name, for this process's parameters only."""
        groups = state.get("param_groups")
        if isinstance(groups, list):
            own = self.state_dict()["param_groups"]
            if len(own) == len(groups):
                state = {**state, "param_groups": [
                    {**g, "params": o["params"]} for g, o in zip(groups, own, strict=False)]}
        _dcp_state().set_optimizer_state_dict(self.model, self.optimizer, state)
