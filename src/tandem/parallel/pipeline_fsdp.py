"""Pipeline stages sharded with FSDP2: stages on the `pp` axis of the mesh, each stage's
parameters, gradients and optimizer state split over the `dp_shard` ranks.

As torchtitan does under a pipeline, each stage's blocks and then the stage itself are
FSDP2 units (`fully_shard` on the `dp` sub-mesh) that stay gathered after forward
(`reshard_after_forward=False`: a stage runs several micro-batches, and would gather its
parameters again for each); the schedule keeps the gradients unsharded until the stage's
last backward and then reduce-scatters them (their mean over the shards), so nothing
else averages the data-parallel ranks. The sharded parameters keep the whole model's
names (`blocks.2.attn.q.weight`, a tied head weight named as its embedding), so DCP
reshards checkpoints between this layout and any other. Tied weights on two processes
have their gradient shards summed over the stages; on one process (a V-shaped schedule
puts the first and last stages together) both stages' FSDP2 units hold the one sharded
parameter, and each adds its reduce-scattered part to its gradient. The gradient norm
sums every rank's shard of every stage once. Under plan.tp the layers the task names are
split over the tensor-parallel peers first (`PipelineStrategy._split`), and FSDP2 shards
those DTensors further over the data ranks (a (dp, tp) DTensor, as torchtitan does).

The whole model, run only for the preflight check, evaluation and the exported module,
is a plain copy that every stage's shards are gathered into on use; the model whose
names key the checkpoints keeps the other stages on the meta device, so a process holds
the whole model once, as under a pipeline of replicas, plus its shards.
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from torch import nn

from tandem.parallel.fsdp import DTYPES
from tandem.parallel.pipeline import PipelineStrategy, _aliases
from tandem.parallel.registry import PP_FSDP, StrategyInfo
from tandem.parallel.stages import units
from tandem.parallel.tensor import local


class PipelineFSDPStrategy(PipelineStrategy):
    """Pipeline stages over the `pp` ranks; each stage sharded over the `dp_shard` ranks."""

    info: ClassVar[StrategyInfo] = PP_FSDP
    shards_weights: ClassVar[bool] = True

    def _wrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        plain = copy.deepcopy(model)  # before sharding: the stages share `model`'s modules
        local = super()._wrap(model)
        tied = {f: fqns for fqns, _ in self.aliases for f in fqns}
        plan, mesh = self.plan, self.layout.mesh
        assert mesh is not None
        kwargs: dict[str, Any] = {"mesh": mesh["dp"], "reshard_after_forward": False,
                                  "mp_policy": MixedPrecisionPolicy(
                                      param_dtype=DTYPES[plan.fsdp_param_dtype],
                                      reduce_dtype=DTYPES[plan.fsdp_reduce_dtype])}
        blocks = set(units(model)[1])
        for stage, module in zip(self.mine, self.stage_modules, strict=True):
            for unit in self.split[stage]:
                if unit in blocks:
                    fully_shard(model.get_submodule(unit), **kwargs)
            fully_shard(module, **kwargs)
        _forget(model, [u for s, units_ in enumerate(self.split) if s not in self.mine
                        for u in units_])
        # FSDP2 registers each sharded parameter on the module that held it: a stage's
        # own copy of the root for the root's parameters. The local module (whose
        # parameters the optimizer takes) and the naming module take them too, a tied
        # weight under each of its names.
        for part in self.parts:
            for fqn, param in part.named_parameters():
                _place(local, fqn, param)
                for name in tied.get(fqn, [fqn]):
                    _place(model, name, param, always=True)
        self.named, self.full = model, plain
        self.aliases = _aliases(model)
        self.live = {**dict(model.named_parameters(remove_duplicate=False)),
                     **dict(model.named_buffers(remove_duplicate=False))}
        return local

    def naming_module(self) -> nn.Module:
        """The model holding this rank's sharded parameters under the whole model's names
        (a tied weight under its first name, as one process names it)."""
        return self.named

    def _average_replicas(self, params: list[nn.Parameter]) -> None:
        """Nothing: the schedule's last backward reduce-scattered the shards' mean."""

    def _no_grad(self, param: nn.Parameter) -> torch.Tensor:
        """Zeros of the shape of this rank's shard (FSDP2 cuts dim 0 as torch.chunk does,
        the ranks past the last chunk holding none)."""
        chunks = torch.chunk(torch.empty(param.shape[0], device="meta"), self.layout.dp_size)
        rows = chunks[self.layout.dp_rank].shape[0] if self.layout.dp_rank < len(chunks) else 0
        return torch.zeros((rows, *param.shape[1:]), dtype=param.dtype,
                           device=self.runtime.device)

    def _first_copy(self) -> bool:
        """Every rank: each holds a shard of a stage that no other rank holds."""
        return True

    def _fill(self, fqn: str, tensor: torch.Tensor) -> None:
        """Gather this stage's shards of `fqn` (its data-parallel ranks, all at once); a
        layer split over the tensor-parallel peers keeps this peer's part of it."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        live = self.live[fqn].detach()
        value = live.full_tensor() if isinstance(live, DTensor) else live
        if isinstance(tensor, DTensor):  # cut locally: every peer has the whole value
            value = distribute_tensor(value, tensor.device_mesh, tensor.placements,
                                      src_data_rank=None).to_local()
        local(tensor.data).copy_(value)

    def weights_replaced(self) -> None:
        """Drop any gathered stage parameters; fetch the other stages' weights again."""
        from torch.distributed.fsdp import FSDPModule

        super().weights_replaced()
        for module in self.stage_modules:
            if isinstance(module, FSDPModule):
                module.reshard()

    def describe(self) -> dict[str, object]:
        """Plan entries for the run record."""
        return {**super().describe(), "dp_shard": self.layout.dp_size,
                "fsdp_param_dtype": self.plan.fsdp_param_dtype,
                "fsdp_reduce_dtype": self.plan.fsdp_reduce_dtype}


def _forget(model: nn.Module, others: list[str]) -> None:
    """Move the units of other processes' stages to the meta device, tied parameters
    still tied: only their names are used here (the whole model that runs is a copy)."""
    metas: dict[int, nn.Parameter] = {}

    def meta(param: nn.Parameter) -> nn.Parameter:
        if id(param) not in metas:
            metas[id(param)] = nn.Parameter(param.detach().to("meta"),
                                            requires_grad=param.requires_grad)
        return metas[id(param)]

    for unit in others:
        path, _, name = unit.rpartition(".")
        owner = model.get_submodule(path)
        held = [(owner, name)] if name in owner._parameters or name in owner._buffers else [
            (module, key) for module in owner.get_submodule(name).modules()
            for key in (*module._parameters, *module._buffers)]
        for module, key in held:
            if (param := module._parameters.get(key)) is not None:
                module._parameters[key] = meta(param)
            elif (buffer := module._buffers.get(key)) is not None:
                module._buffers[key] = buffer.to("meta")


def _place(model: nn.Module, fqn: str, param: nn.Parameter, always: bool = False) -> None:
    """Register `param` as `model`'s parameter `fqn` where `model` holds one by that name
    (or, `always`, wherever the name's module is)."""
    path, _, name = fqn.rpartition(".")
    try:
        owner = model.get_submodule(path)
    except AttributeError:  # a unit this module does not hold
        return
    if owner is not None and (always or owner._parameters.get(name) is not None):
        owner._parameters[name] = param
