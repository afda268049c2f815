"""The runs that the kill-and-resume tests stop and restart: two fine-tunes of the toy
model from its base weights (its first layer frozen; LoRA adapters) and a two-task run
(mix_task), each with its length, a global batch of 20 and a checkpoint every 5 steps
committed before the next step starts."""

from __future__ import annotations

from torch import nn

import tandem
from tests.dist import mix_task, toy_task

STEPS = {"freeze": 10, "lora": 20, "mix": 10}  # in the order a job runs them
NAMES = {"freeze": "toy", "lora": "toy", "mix": "mix"}  # their run names in the store
GLOBAL = 20
assert toy_task.FINE_TUNE_STEPS.items() <= STEPS.items()


def fit(part: str, run_dir: str, steps: int, source: str) -> tuple[nn.Module, list]:
    """Run `part` for `steps` steps in `run_dir` (a fine-tune from the weights at
    `source`); its final model and the samples this process trained on, in order (a
    mixture's as [source, id])."""
    if part == "mix":
        mix_task.SEEN.clear()
        cfg = mix_task.config(run_dir, steps, GLOBAL,
                              checkpoint={"every": 5, "async_save": False})
        model = tandem.fit(mix_task.task(), config=cfg).model
        return model, [list(s) for s in mix_task.SEEN]
    toy_task.SEEN.clear()
    cfg = toy_task.fine_tune_config(run_dir, steps, source, part)
    return tandem.fit(toy_task.task(), config=cfg).model, list(toy_task.SEEN)
