"""The resumable runs as a user script: `resumable_runs.py ROOT SOURCE` runs each of
resumable.STEPS (the fine-tunes from the weights at SOURCE, then the two-task run), one
after the other, in ROOT/<part>, and writes its final weights, the frozen ones included
(checkpoints leave those out), to ROOT/<part>/final.pt."""

import os
import sys
from pathlib import Path

import torch

from tests.faults import resumable

if __name__ == "__main__":
    root, source = sys.argv[1:3]
    for part, steps in resumable.STEPS.items():
        model, _ = resumable.fit(part, str(Path(root, part)), steps, source)
        if os.environ.get("RANK", "0") == "0":
            torch.save(model.state_dict(), Path(root, part, "final.pt"))
