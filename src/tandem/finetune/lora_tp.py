"""LoRA adapters on tensor-parallel layers (plan.tp > 1): each adapter split the way its
base layer's product is, so the adapted layer needs no communication the base layer does
not already do.

A column-wise layer (weight `Shard(0)`: each peer computes a slice of the outputs) keeps
`lora_A` (rank x in) whole on every peer and splits `lora_B` (out x rank) by rows like the
weight: `x A^T` is the same on every peer and `B` gives each peer its slice of the update.
A row-wise layer (weight `Shard(1)`: each peer holds a slice of the inputs and a partial
sum of the outputs) splits `lora_A` by columns like the weight and keeps `lora_B` whole:
`x_p A_p^T` is a partial sum that `B` maps linearly to a partial sum of the update, which
joins the base layer's partial sum in the one all-reduce the layer already does (DTensor's
`Partial` placement). Parameters stay under their names, so checkpoints reshard between
a tensor-parallel run and one process.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def styles() -> dict[str, Any]:
    """{'colwise': style, 'rowwise': style} for a layer with LoRA adapters."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def partition(placements: dict[str, dict[str, Any]]) -> Any:
        def fn(self: Any, name: str, module: nn.Module, mesh: Any) -> None:
            # name: "" (the layer), "lora_A", "lora_B"; what is not placed here is
            # replicated by distribute_module
            for param_name, placement in placements.get(name, {}).items():
                param = getattr(module, param_name)
                if param is None:
                    continue
                module.register_parameter(param_name, nn.Parameter(
                    distribute_tensor(param, mesh, [placement],
                                      src_data_rank=self.src_data_rank),
                    requires_grad=param.requires_grad))
        return fn

    colwise = {"": {"weight": Shard(0), "bias": Shard(0)}, "lora_B": {"weight": Shard(0)}}
    rowwise = {"": {"weight": Shard(1), "bias": Replicate()}, "lora_A": {"weight": Shard(1)}}
    col = type("LoRAColwiseParallel", (ColwiseParallel,),
               {"_partition_linear_fn": partition(colwise)})
    row = type("LoRARowwiseParallel", (RowwiseParallel,),
               {"_partition_linear_fn": partition(rowwise)})
    return {"colwise": col, "rowwise": row}


def is_adapted(module: nn.Module) -> bool:
    """Whether `module` is a Linear layer with tandem's LoRA adapters."""
    from tandem.finetune.lora import LoRALinear

    return isinstance(module, LoRALinear)


def is_adapter(name: str) -> bool:
    """Whether the module named `name` is an adapter of a LoRA layer (split with it)."""
    return name.rsplit(".", 1)[-1] in ("lora_A", "lora_B")
