"""LoRA adapters (`train.lora_rank`): low-rank updates trained beside frozen weights.

Each targeted `nn.Linear` (`train.lora_targets`: comma-separated glob patterns over
module names; empty: every Linear) becomes a `LoRALinear` that keeps its own `weight`
and `bias` under their names (so `run.init_from` a base model and the base checkpoints
need no mapping) and adds `lora_A` (rank x in, Kaiming-uniform as PEFT does) and
`lora_B` (out x rank, zeros, so the model starts as the base model). Its output is
`x W^T + b + (alpha / rank) x A^T B^T`. Every other parameter is frozen: only the
adapters reach DDP's buckets and the optimizer (`finetune.freeze`'s route), so the
optimizer state is the adapters' alone. The names follow PEFT's (`<module>.lora_A.weight`):
`save_adapter` writes `adapter_model.safetensors` with PEFT's `base_model.model.` prefix
and an `adapter_config.json`; `merged_state_dict` gives the base model's own state dict
with each update folded in (W + (alpha / rank) B A), for a model without adapters.

Plans: one process, DDP, FSDP2, tensor and pipeline parallelism and the
low-communication strategies. Under FSDP2 a layer's frozen base and its adapters are
sharded in the same unit; only the adapters get gradients to reduce, and the checkpoints
hold them whole (DCP gathers the shards), so an adapter checkpoint resumes at any world
size. Under tensor parallelism a split layer's adapters are split with it
(`finetune.lora_tp`); a pipeline stage holds the adapters of its own layers.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import math
import re
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from tandem.components.base import Component
from tandem.finetune import peft_model

log = logging.getLogger(__name__)
PEFT_PREFIX = "base_model.model."


class LoRALinear(nn.Linear):
    """A Linear layer with a LoRA update beside its (frozen) weight."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **factory)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **factory)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(x)) * self.scaling

    def merged_weight(self) -> torch.Tensor:
        """W + (alpha / rank) B A."""
        return self.weight + self.scaling * (self.lora_B.weight @ self.lora_A.weight)


def targets(model: nn.Module, patterns: list[str]) -> list[str]:
    """Names of the Linear modules the patterns select (every Linear when none given);
    ValueError when a pattern selects no Linear, naming those that exist."""
    linears = [name for name, m in model.named_modules() if type(m) is nn.Linear]
    if not linears:
        raise ValueError("train.lora_rank: the model has no nn.Linear layer to adapt")
    if not patterns:
        return linears
    chosen: set[str] = set()
    for pattern in patterns:
        hits = fnmatch.filter(linears, pattern)
        if not hits:
            raise ValueError(f"train.lora_targets: {pattern!r} matches no nn.Linear; the "
                             f"model's Linear layers are {', '.join(linears[:12])}"
                             + (", ..." if len(linears) > 12 else ""))
        chosen.update(hits)
    return [n for n in linears if n in chosen]


class LoRA(Component):
    """`train.lora_rank` as a run component (see the module docstring)."""

    def __init__(self, rank: int, alpha: float, patterns: list[str]) -> None:
        if rank < 1:
            raise ValueError(f"train.lora_rank {rank}: must be at least 1 (0 turns LoRA off)")
        if alpha <= 0:
            raise ValueError(f"train.lora_alpha {alpha}: must be > 0")
        self.rank, self.alpha, self.patterns = rank, alpha, patterns
        self.adapted: list[str] = []

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Adapters on the targeted Linear layers; everything else frozen."""
        self.adapted = targets(model, self.patterns)
        for p in model.parameters():
            p.requires_grad_(False)
        self.rebuilt(model)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        log.info("train.lora_rank %d: adapters on %d Linear layer(s); %d of %d weights "
                 "train (%.2f%%)", self.rank, len(self.adapted), trained, total,
                 100 * trained / total)
        return model

    def rebuilt(self, model: nn.Module) -> nn.Module:
        """The adapters on the same layers of a fresh build."""
        for name in self.adapted:
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, LoRALinear(getattr(parent, child), self.rank, self.alpha))
        return model


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapters' weights under PEFT's names (`base_model.model.<module>.lora_A.weight`)."""
    return {PEFT_PREFIX + name: p.detach().cpu().contiguous()
            for name, p in model.named_parameters() if ".lora_A." in name
            or ".lora_B." in name}


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapter folded into its weight (a
    peft.PeftModel's by PEFT's own `merge_and_unload`)."""
    if peft_model.is_peft(model):
        return peft_model.merged(model)
    merged = {k: v.detach().clone() for k, v in model.state_dict().items()
              if ".lora_A." not in k and ".lora_B." not in k}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            merged[f"{name}.weight"] = module.merged_weight().detach().clone()
    return merged


def peft_targets(model: nn.Module, adapted: list[str]) -> list[str] | str:
    """`target_modules` for PEFT that selects exactly the adapted modules: their names, or
    (when PEFT's suffix rule, `name == t or name.endswith("." + t)`, would also select
    another module, e.g. `1.0` for `0`) a regular expression PEFT matches whole."""
    chosen = set(adapted)
    others = [name for name, _ in model.named_modules()
              if name not in chosen and ".lora_" not in name]
    if any(n.endswith("." + t) for n in others for t in adapted):
        return "(?:" + "|".join(re.escape(t) for t in adapted) + ")"
    return adapted


def save_adapter(model: nn.Module, directory: str | Path) -> Path:
    """Write `adapter_model.safetensors` and `adapter_config.json` (PEFT's layout, which
    `peft.PeftModel.from_pretrained` loads onto the base model) of a model trained with
    `train.lora_rank`, or of a peft.PeftModel (through PEFT); returns the directory."""
    from safetensors.torch import save_file

    if peft_model.is_peft(model):
        return peft_model.save(model, directory)
    layers = {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}
    if not layers:
        raise ValueError("save_adapter: the model has no LoRA adapters (train.lora_rank 0)")
    first = next(iter(layers.values()))
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state_dict(model), str(out / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": first.rank, "lora_alpha": first.alpha,
              "target_modules": peft_targets(model, sorted(layers)), "bias": "none",
              "lora_dropout": 0.0, "fan_in_fan_out": False, "task_type": None}
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
