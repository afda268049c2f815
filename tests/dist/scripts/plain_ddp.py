"""A plain DDP training script in the style of PyTorch's DDP tutorial (no tandem).

Run under torchrun: `torchrun --standalone --nproc-per-node 2 plain_ddp.py`. The
--slow-rank/--slow-ms flags make one rank wait before each batch, as a rank with a
slow input pipeline would, so an observer has a straggler to find.
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 64)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(64, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=0.0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)

    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    for _ in range(args.steps):
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1000)
        inputs, labels = torch.randn(args.batch, 10), torch.randn(args.batch, 5)
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(inputs), labels)
        loss.backward()
        optimizer.step()

    with torch.no_grad():  # an evaluation pass: not a training batch
        ddp_model(torch.randn(4 * args.batch, 10))
    if rank == 0:
        print(f"done: {args.steps} steps, last loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
