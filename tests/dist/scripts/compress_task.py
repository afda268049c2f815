"""A small classifier as a user script, for `tandem compress`: four Gaussian classes in
16 dimensions, an MLP wide enough to prune and factorise."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

import tandem

CENTRES = torch.randn(4, 16, generator=torch.Generator().manual_seed(5)) * 0.6


def blobs(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(CENTRES[y] + torch.randn(n, 16, generator=g), y)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def accuracy(logits: torch.Tensor, batch) -> torch.Tensor:
    return (logits.argmax(1) == batch[1]).float().mean()


task = tandem.Task(
    model=make_model,
    optimizer=lambda params: torch.optim.Adam(params, lr=1e-2),
    train_data=lambda: blobs(512, 0),
    eval_data=lambda: blobs(256, 1),
    loss=tandem.CrossEntropy(),
    metrics={"accuracy": accuracy},
)

if __name__ == "__main__":
    tandem.fit(task)
