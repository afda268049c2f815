"""The peer comparison's hand-written contender: plain torch DDP, as a user would write it.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/peers/ddp_loop.py --task mnist1d --out /tmp/peers/ddp

DistributedSampler(shuffle=True, seed) re-seeded per epoch, drop_last batches, the recipe's
lr multiplier set on every param group before each step, evaluation on a
DistributedSampler(shuffle=False) shard with the sums all-reduced once. A recipe that
averages its weights (EMA) keeps the average after every step, with tandem's warm-up of the
decay, and evaluates it. The optimizer is the recipe's own, stepped as it is on every rank
(Muon orthogonalises every matrix on every rank). A bf16 recipe runs its forward passes
under `torch.autocast("cpu", dtype=torch.bfloat16)`, as torch's documentation shows.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe as rc  # noqa: E402


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: DataLoader, r: rc.Recipe) -> dict[str, float]:
    """Mean per-sample loss (and accuracy) over the whole eval set. All ranks."""
    model.eval()
    totals, names = None, None
    for batch in loader:
        with r.autocast():
            logits = model(batch[0])
        values = rc.per_sample(logits, batch)
        names = sorted(values)
        part = rc.sums(values)
        totals = part if totals is None else totals + part
    model.train()
    assert totals is not None and names is not None
    dist.all_reduce(totals)
    return rc.means(names, totals)


@torch.no_grad()
def update_average(average: list[torch.Tensor], params: list[torch.Tensor], decay: float,
                   updates: int) -> None:
    """average <- d * average + (1 - d) * params, d = min(decay, (1 + n) / (10 + n)) for
    update number n (0-based)."""
    d = min(decay, (1 + updates) / (10 + updates))
    torch._foreach_lerp_(average, [p.detach() for p in params], 1.0 - d)


@contextlib.contextmanager
def swapped(params: list[torch.Tensor], average: list[torch.Tensor] | None) -> Iterator[None]:
    """Inside: the parameters hold their average (when the recipe keeps one)."""
    if average is None:
        yield
        return
    with torch.no_grad():
        kept = [p.detach().clone() for p in params]
        torch._foreach_copy_(params, average)
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(params, kept)


def main() -> None:
    args = rc.parse_args()
    rc.limit_threads()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    r = rc.recipe(args.task, args.steps)
    log = rc.FetchLog()
    train_set = rc.Clocked(r.train_set(), log, "train")
    eval_set = rc.Clocked(r.eval_set(), log, "eval")
    torch.manual_seed(args.seed)
    model = DistributedDataParallel(r.model())
    optimizer = r.optimizer(model.parameters())
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    sampler = DistributedSampler(train_set, world, rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train_set, batch_size=r.per_process_batch(world), sampler=sampler,
                        drop_last=True)
    eval_loader = DataLoader(eval_set, batch_size=r.eval_batch,
                             sampler=DistributedSampler(eval_set, world, rank, shuffle=False))
    params = [p for p in model.parameters() if p.requires_grad]
    average = [p.detach().clone() for p in params] if r.ema_decay else None
    evals: list[dict[str, float]] = []
    step, epoch = 0, 0
    while step < r.steps:
        sampler.set_epoch(epoch)
        epoch += 1
        for batch in loader:
            factor = r.lr_multiplier(step)
            for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = base * factor
            with r.autocast():
                logits = model(batch[0])
            loss = rc.loss(logits, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if r.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), r.grad_clip)
            optimizer.step()
            if average is not None:
                update_average(average, params, r.ema_decay, step)
            step += 1
            if r.evaluates_at(step):
                with swapped(params, average):
                    evals.append({"step": step, **evaluate(model.module, eval_loader, r)})
            if step == r.steps:
                break
    rc.write_result(args.out, rank, log, evals, steps=step, epochs=epoch)
    del model, optimizer  # the DDP reducer holds the group: free it first
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
