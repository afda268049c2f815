"""The repeated blocks of a model: the units of sharding and of activation checkpointing."""

from __future__ import annotations

from torch import nn


def _has_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def find_blocks(model: nn.Module,
                block_types: tuple[type, ...] | None = None) -> list[nn.Module]:
    """The sub-modules to shard as units, outermost first, never nested in one another.

    With `block_types`, every module whose type is one of them (the root excluded).
    Without, the auto rule: the children of the outermost `nn.ModuleList` /
    `nn.Sequential` containers that hold more than one child (the root itself counts),
    keeping only children that own parameters. This finds the repeated layers of the
    usual models (`self.layers = nn.ModuleList([...])`, `nn.Sequential(Linear, ReLU,
    Linear)`); the search does not descend into a chosen block, so a block's own inner
    Sequential (an MLP inside a transformer layer) stays part of that block's single
    all-gather instead of splitting it into many small ones.
    """
    blocks: list[nn.Module] = []

    def visit(module: nn.Module, is_root: bool) -> None:
        if block_types is not None:
            if not is_root and isinstance(module, block_types):
                blocks.append(module)
                return
        elif isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) > 1:
            blocks.extend(child for child in module.children() if _has_params(child))
            return
        for child in module.children():
            visit(child, False)

    visit(model, True)
    return blocks
