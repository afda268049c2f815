"""The toy task with a metric that returns one value per sample on batches of more than
40 samples: evaluation batches (train.eval_batch 64), not training ones (global batch
40), so it passes the preflight on a training batch. `--good-metric` fixes it."""

import sys

import torch

import tandem
from tests.dist import toy_task


def per_sample_error(out: torch.Tensor, batch) -> torch.Tensor:
    error = (out - batch[1]).abs().mean(1)
    return error.mean() if len(error) <= 40 or "--good-metric" in sys.argv else error


task = tandem.Task(
    model=toy_task.make_model,
    optimizer=toy_task.make_optimizer,
    train_data=toy_task.IndexedData,
    eval_data=toy_task.IndexedData,
    loss=toy_task.loss,
    metrics={"abs_error": per_sample_error},
)

if __name__ == "__main__":
    tandem.fit(task, argv=[a for a in sys.argv[1:] if a != "--good-metric"])
