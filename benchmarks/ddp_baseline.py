"""A hand-written DDP training loop: the baseline that tandem's overhead is measured against.

Launched by torchrun. Same model, data, optimizer and global batch as
`examples/mnist1d_cnn.py`; every `--log-every` steps it all-reduces the loss and rank 0
prints one JSON line with the step and the wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from mnist1d_model import MNIST1D, make_model, make_optimizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--log-every", type=int, default=25)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = MNIST1D(train=True, augment=False)
    model = DDP(make_model())
    opt = make_optimizer(model.parameters())
    per_rank = args.global_batch // world
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(data), generator=gen)
    loader = torch.utils.data.DataLoader(data, batch_size=per_rank, drop_last=True,
                                         sampler=order[rank::world].tolist())
    batches, window_loss = iter(loader), torch.zeros(())
    for step in range(1, args.steps + 1):
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        window_loss += loss.detach()
        if step % args.log_every == 0:
            dist.all_reduce(window_loss)
            if rank == 0:
                mean = window_loss.item() / world / args.log_every
                print(json.dumps({"step": step, "loss": mean, "time": time.time()}), flush=True)
            window_loss.zero_()
    del model, opt  # the DDP reducer holds the group: free it first
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
