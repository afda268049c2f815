"""A two-source mixture (classification + regression, one trunk, a head each) whose samples
carry their ids, and its plain-PyTorch reference."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

import tandem

SEEN: list[tuple[str, int]] = []  # (source, sample id) this process trained on, in order
SIZES = {"cls": 90, "reg": 50}
WEIGHTS = {"cls": 1.0, "reg": 3.0}


class Indexed(Dataset):
    """Fixed random inputs [12] and targets; item i is (x_i, y_i, i)."""

    def __init__(self, name: str, n: int, eval_: bool = False) -> None:
        g = torch.Generator().manual_seed((11 if name == "cls" else 22) + 100 * eval_)
        self.x = torch.randn(n, 12, generator=g)
        self.y = (torch.randint(0, 3, (n,), generator=g) if name == "cls"
                  else torch.randn(n, generator=g))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(12, 16), nn.Tanh())
        self.cls = nn.Linear(16, 3)
        self.reg = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.trunk(x)
        return {"cls": self.cls(h), "reg": self.reg(h).squeeze(-1)}


def _record(name: str, batch) -> None:
    if torch.is_grad_enabled():  # a training pass (preflight and records run without grad)
        SEEN.extend((name, int(i)) for i in batch[2])


def cls_loss(out: torch.Tensor, batch) -> torch.Tensor:
    _record("cls", batch)
    return F.cross_entropy(out, batch[1])


def reg_loss(out: torch.Tensor, batch) -> torch.Tensor:
    _record("reg", batch)
    return F.mse_loss(out, batch[1])


def accuracy(out: torch.Tensor, batch) -> torch.Tensor:
    return (out.argmax(-1) == batch[1]).float().mean()


def mixture(**weights: float) -> tandem.Mixture:
    w = weights or WEIGHTS
    return tandem.Mixture([
        tandem.Source(name="cls", train=lambda: Indexed("cls", SIZES["cls"]), loss=cls_loss,
                      eval=lambda: Indexed("cls", 30, True), head="cls", weight=w["cls"],
                      metrics={"accuracy": accuracy}),
        tandem.Source(name="reg", train=lambda: Indexed("reg", SIZES["reg"]), loss=reg_loss,
                      eval=lambda: Indexed("reg", 20, True), head="reg", weight=w["reg"]),
    ])


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def task(mix: tandem.Mixture | None = None) -> tandem.Task:
    mix = mix or mixture()
    return tandem.Task(model=TwoHeads, optimizer=make_optimizer, train_data=mix.train,
                       eval_data=mix.eval, loss=mix.loss)


def stream(seed: int, steps: int, global_batch: int) -> list[list[tuple[str, int]]]:
    """The global batches of the run, from the mixture's documented epoch order."""
    data = mixture().train()
    out, epoch, offset = [], 0, 0
    for _ in range(steps):
        if offset + global_batch > len(data):
            epoch, offset = epoch + 1, 0
        codes = data.epoch_order(seed, epoch)[offset:offset + global_batch].tolist()
        offset += global_batch
        out.append([(data.names[k], int(s[2])) for k, s in (data[c] for c in codes)])
    return out


def reference(seed: int, steps: int,
              global_batch: int) -> tuple[nn.Module, list[dict[str, tuple[float, int]]]]:
    """One process, plain PyTorch: each global batch's per-sample mean loss. Also each
    step's (loss, samples) of every source in its batch."""
    from tandem.runtime import derive_seed

    torch.manual_seed(derive_seed("build", seed))
    model = TwoHeads()
    opt = make_optimizer(model.parameters())
    data = {name: Indexed(name, n) for name, n in SIZES.items()}
    per_step = []
    for batch in stream(seed, steps, global_batch):
        opt.zero_grad()
        total = torch.zeros(())
        per_step.append({})
        for name, ids in (("cls", [i for s, i in batch if s == "cls"]),
                          ("reg", [i for s, i in batch if s == "reg"])):
            if not ids:
                continue
            out = model(data[name].x[ids])[name]
            fn = F.cross_entropy if name == "cls" else F.mse_loss
            loss = fn(out, data[name].y[ids])
            per_step[-1][name] = (loss.item(), len(ids))
            total = total + loss * len(ids) / global_batch
        total.backward()
        opt.step()
    return model, per_step


def config(run_dir: str, steps: int, global_batch: int, seed: int = 5,
           **sections: dict) -> tandem.Config:
    cfg = tandem.Config()
    cfg.run.dir, cfg.run.name, cfg.run.seed = run_dir, "mix", seed
    cfg.train.steps, cfg.train.global_batch = steps, global_batch
    cfg.monitor.progress = "off"
    cfg.monitor.calibrate_at = 0  # calibration re-runs the loss, which SEEN would count
    cfg.monitor.report = False
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg
