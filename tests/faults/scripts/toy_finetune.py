"""The toy model's fine-tunes as a user script: `toy_finetune.py ROOT SOURCE` runs each of
toy_task.FINE_TUNES from the weights at SOURCE, one after the other, in ROOT/<part>, and
writes its final weights, the frozen ones included (checkpoints leave those out), to
ROOT/<part>/final.pt."""

import os
import sys
from pathlib import Path

import torch

import tandem
from tests.dist import toy_task

if __name__ == "__main__":
    root, source = sys.argv[1:3]
    for part in sorted(toy_task.FINE_TUNES):
        out = Path(root, part)
        cfg = toy_task.fine_tune_config(str(out), toy_task.FINE_TUNE_STEPS[part], source, part)
        result = tandem.fit(toy_task.task(), config=cfg)
        if os.environ.get("RANK", "0") == "0":
            torch.save(result.model.state_dict(), out / "final.pt")
