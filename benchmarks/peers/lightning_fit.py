"""The peer comparison's PyTorch Lightning contender: a LightningModule and ``Trainer.fit``.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        benchmarks/peers/lightning_fit.py --task mnist1d --out /tmp/peers/lightning

``Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy="ddp")`` under torchrun:
Lightning sees torchrun's environment and joins its processes instead of starting its
own. Lightning puts a DistributedSampler (seeded by ``seed_everything``) in front of both
DataLoaders. The schedule is a per-step LambdaLR over the recipe's lr multiplier;
validation runs every ``eval_every`` optimizer steps (``val_check_interval`` with
``check_val_every_n_epoch=None``). Extras that the other contenders do not do are off:
the sanity-check validation, the progress bar, the model summary, the logger and
per-epoch checkpointing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe as rc  # noqa: E402


class PeerModule(L.LightningModule):
    """The recipe's model, loss, optimizer, schedule and evaluation as a LightningModule."""

    def __init__(self, recipe: rc.Recipe, log: rc.FetchLog) -> None:
        super().__init__()
        self.recipe = recipe
        self.fetch_log = log
        self.model = recipe.model()
        self.totals: torch.Tensor | None = None
        self.names: list[str] = []
        self.evals: list[dict[str, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: rc.Batch, batch_idx: int) -> torch.Tensor:
        return rc.loss(self.model(batch[0]), batch)

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer = self.recipe.optimizer(self.model.parameters())
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, self.recipe.lr_multiplier)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}

    def train_dataloader(self) -> DataLoader:
        data = rc.Clocked(self.recipe.train_set(), self.fetch_log, "train")
        return DataLoader(data, batch_size=self.recipe.per_process_batch(self.trainer.world_size),
                          shuffle=True, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        data = rc.Clocked(self.recipe.eval_set(), self.fetch_log, "eval")
        return DataLoader(data, batch_size=self.recipe.eval_batch)

    def on_validation_epoch_start(self) -> None:
        self.totals = None

    def validation_step(self, batch: rc.Batch, batch_idx: int) -> None:
        values = rc.per_sample(self.model(batch[0]), batch)
        self.names = sorted(values)
        part = rc.sums(values)
        self.totals = part if self.totals is None else self.totals + part

    def on_validation_epoch_end(self) -> None:
        assert self.totals is not None
        totals = self.trainer.strategy.reduce(self.totals, reduce_op="sum")
        self.evals.append({"step": self.global_step, **rc.means(self.names, totals)})


def main() -> None:
    args = rc.parse_args()
    rc.limit_threads()
    r = rc.plain(rc.recipe(args.task, args.steps), "lightning_fit.py")
    L.seed_everything(args.seed, verbose=False)
    log = rc.FetchLog()
    module = PeerModule(r, log)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, num_nodes=1, strategy="ddp", max_steps=r.steps,
        val_check_interval=r.eval_every, check_val_every_n_epoch=None,
        gradient_clip_val=r.grad_clip or None, num_sanity_val_steps=0,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(module)
    rc.write_result(args.out, trainer.global_rank, log, module.evals, steps=trainer.global_step,
                    epochs=trainer.current_epoch)


if __name__ == "__main__":
    main()
