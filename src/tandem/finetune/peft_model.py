"""A user's PEFT model as the model: `Task.model` returns a `peft.PeftModel`.

PEFT has already frozen the base and added its adapters, so tandem trains what requires a
gradient (the adapters: the optimizer and DDP's buckets hold them alone) and adds no
adapters of its own (`train.lora_rank` with a PeftModel is refused: the layers would be
adapted twice). The base is what the model factory builds at every start (a pretrained
base loaded by the factory, or a seeded build: the same at every start and every world
size), so checkpoints hold the adapters only, as they do for `run.init_from`, and a resume
continues exactly. The trained model handed back is a PeftModel: its own
`save_pretrained` and `merge_and_unload` apply, and so do `finetune.lora.save_adapter`
(PEFT's files, through PEFT) and `merged_state_dict`.

peft is not imported here: a model is a PeftModel only if the user's code imported peft.
"""

from __future__ import annotations

import copy
import logging
import sys
from pathlib import Path

import torch
from torch import nn

from tandem.components.base import Component

log = logging.getLogger(__name__)


def is_peft(model: nn.Module) -> bool:
    """Whether `model` is a `peft.PeftModel` (False when peft was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def save(model: nn.Module, directory: str | Path) -> Path:
    """PEFT's own files of a PeftModel's adapters (adapter_model.safetensors,
    adapter_config.json), for `PeftModel.from_pretrained`."""
    out = Path(directory)
    model.save_pretrained(str(out))  # type: ignore[operator]
    return out


def merged(model: nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with the adapters folded in by PEFT's
    `merge_and_unload` (on a copy: the adapter model is left as it is)."""
    plain = copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]
    return {k: v.detach().clone() for k, v in plain.state_dict().items()}


class PeftAdapters(Component):
    """Recognises a PeftModel: trains its adapters, checkpoints them alone."""

    def __init__(self, lora_rank: int = 0) -> None:
        self.lora_rank = lora_rank
        self.restores_frozen = False  # True once the model is a PeftModel

    def transform_model(self, model: nn.Module, device: torch.device) -> nn.Module:
        """Check a PeftModel (the model as it is otherwise)."""
        if not is_peft(model):
            return model
        if self.lora_rank:
            raise ValueError(f"train.lora_rank {self.lora_rank}: the model is a "
                             "peft.PeftModel, whose adapters already train; set "
                             "train.lora_rank 0 to train them, or build the model without "
                             "peft to have tandem add its own")
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        if not trained:
            raise ValueError("Task.model returned a peft.PeftModel with no parameter to "
                             "train (its adapters are frozen: was it loaded with "
                             "is_trainable=False?); pass is_trainable=True to "
                             "PeftModel.from_pretrained")
        self.restores_frozen = True
        total = sum(p.numel() for p in model.parameters())
        log.info("peft.PeftModel: %d of %d weights train (%.2f%%, its adapters); "
                 "checkpoints hold them alone", trained, total, 100 * trained / total)
        return model
