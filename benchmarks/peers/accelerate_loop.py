"""The peer comparison's HuggingFace Accelerate contender, written the way its docs show.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/peers/accelerate_loop.py --task mnist1d --out /tmp/peers/accelerate

``Accelerator.prepare`` wraps the model (DDP), the optimizer and both DataLoaders (each
process takes its share of every global batch; the shuffle is Accelerate's seedable
sampler, seeded with ``set_seed(seed)`` and re-seeded per epoch with ``set_epoch``).
The lr multiplier is set on the param groups before each step rather than through a
prepared scheduler: a prepared scheduler steps once per process per optimizer step
unless the schedule is rewritten for it. Evaluation gathers the per-sample values with
``gather_for_metrics``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe as rc  # noqa: E402


@torch.no_grad()
def evaluate(accelerator: Accelerator, model: torch.nn.Module,
             loader: DataLoader) -> dict[str, float]:
    """Mean per-sample loss (and accuracy) over the whole eval set. All processes."""
    model.eval()
    totals, names = None, None
    for batch in loader:
        values = accelerator.gather_for_metrics(rc.per_sample(model(batch[0]), batch))
        names = sorted(values)
        part = rc.sums(values)
        totals = part if totals is None else totals + part
    model.train()
    assert totals is not None and names is not None
    return rc.means(names, totals)


def main() -> None:
    args = rc.parse_args()
    rc.limit_threads()
    accelerator = Accelerator(cpu=True,
                              dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    world = accelerator.num_processes
    r = rc.plain(rc.recipe(args.task, args.steps), "accelerate_loop.py")
    log = rc.FetchLog()
    train_set = rc.Clocked(r.train_set(), log, "train")
    eval_set = rc.Clocked(r.eval_set(), log, "eval")
    set_seed(args.seed)
    model = r.model()
    optimizer = r.optimizer(model.parameters())
    loader = DataLoader(train_set, batch_size=r.per_process_batch(world), shuffle=True,
                        drop_last=True)
    eval_loader = DataLoader(eval_set, batch_size=r.eval_batch)
    model, optimizer, loader, eval_loader = accelerator.prepare(model, optimizer, loader,
                                                                eval_loader)
    base_lrs = [group["lr"] for group in optimizer.param_groups]
    evals: list[dict[str, float]] = []
    step, epoch = 0, 0
    while step < r.steps:
        loader.set_epoch(epoch)
        epoch += 1
        for batch in loader:
            factor = r.lr_multiplier(step)
            for group, base in zip(optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = base * factor
            loss = rc.loss(model(batch[0]), batch)
            accelerator.backward(loss)
            if r.grad_clip:
                accelerator.clip_grad_norm_(model.parameters(), r.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if r.evaluates_at(step):
                evals.append({"step": step, **evaluate(accelerator, model, eval_loader)})
            if step == r.steps:
                break
    rc.write_result(args.out, accelerator.process_index, log, evals, steps=step, epochs=epoch,
                    distributed_type=str(accelerator.distributed_type))
    accelerator.end_training()


if __name__ == "__main__":
    main()
