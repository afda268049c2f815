"""A small regression task whose samples carry their ids, and its plain-PyTorch reference."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector
from torch.utils.data import Dataset

import tandem
from tandem.data.sampler import epoch_order
from tandem.runtime import derive_seed

SEEN: list[int] = []  # sample ids this process trained on, in order
N_SAMPLES = 200


class IndexedData(Dataset):
    """Fixed random inputs and targets; item i is (x_i, y_i, i)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N_SAMPLES, 12, generator=g)
        self.y = torch.randn(N_SAMPLES, 3, generator=g)

    def __len__(self) -> int:
        return N_SAMPLES

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 3))


def make_optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def replicas(world: int, optimizer: Callable[..., torch.optim.Optimizer]) -> tuple[
        IndexedData, list[nn.Module], list[torch.optim.Optimizer], torch.Tensor, torch.Tensor]:
    """The start of a one-process reference of an outer-step plan (DiLoCo, streaming,
    async): the data, `world` copies of the model as a run builds it (its seed) with an
    optimizer each, the outer parameters as one flat vector and a zero outer velocity."""
    torch.manual_seed(derive_seed("build", 7))
    data, base = IndexedData(), make_model()
    reps = [copy.deepcopy(base) for _ in range(world)]
    outer = parameters_to_vector(base.parameters()).detach().clone()
    return data, reps, [optimizer(r.parameters()) for r in reps], outer, torch.zeros_like(outer)


def inner_steps(data: IndexedData, reps: list[nn.Module],
                opts: list[torch.optim.Optimizer], ids: list[int]) -> None:
    """One step of every replica, each on its equal share of the global batch `ids`."""
    share = len(ids) // len(reps)
    for r, (model, opt) in enumerate(zip(reps, opts, strict=True)):
        mine = torch.tensor(ids[r * share:(r + 1) * share])
        opt.zero_grad()
        nn.functional.mse_loss(model(data.x[mine]), data.y[mine]).backward()
        opt.step()


def loss(out: torch.Tensor, batch) -> torch.Tensor:
    if torch.is_grad_enabled():  # a training pass (the preflight check runs without grad)
        SEEN.extend(int(i) for i in batch[2])
    return nn.functional.mse_loss(out, batch[1])


def task() -> tandem.Task:
    return tandem.Task(model=make_model, optimizer=make_optimizer, train_data=IndexedData,
                       loss=loss)


def config(run_dir: str, steps: int, global_batch: int, micro_batch: int = 0,
           seed: int = 7, **sections: dict) -> tandem.Config:
    cfg = tandem.Config()
    cfg.run.dir, cfg.run.name, cfg.run.seed = run_dir, "toy", seed
    cfg.train.steps, cfg.train.global_batch = steps, global_batch
    cfg.train.micro_batch = micro_batch
    cfg.monitor.progress = "off"
    # Calibration re-runs the loss on a batch, which SEEN would count as training.
    cfg.monitor.calibrate_at = 0
    cfg.monitor.report = False  # the HTML report has its own tests
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    return cfg


# Fine-tunes of the toy model (their train sections, and their lengths): its first layer
# frozen, or LoRA adapters on both Linears.
FINE_TUNES = {"freeze": {"freeze": "0.*"}, "lora": {"lora_rank": 2}}
FINE_TUNE_STEPS = {"freeze": 10, "lora": 20}


def fine_tune_config(run_dir: str, steps: int, source: str, part: str) -> tandem.Config:
    """config() of a fine-tune (FINE_TUNES[part]) from the weights at `source`, with a
    checkpoint every 5 steps committed before the next step starts."""
    return config(run_dir, steps, 20, run={"init_from": source}, train=FINE_TUNES[part],
                  checkpoint={"every": 5, "async_save": False})


def global_batches(steps: int, global_batch: int, seed: int = 7,
                   n: int = N_SAMPLES) -> Iterator[torch.Tensor]:
    """The sample ids of each of `steps` global batches in the documented order: epochs of
    `epoch_order(seed, epoch, n)`, a batch that does not fit an epoch's rest starts the next."""
    epoch, offset = 0, 0
    for _ in range(steps):
        if offset + global_batch > n:
            epoch, offset = epoch + 1, 0
        yield epoch_order(seed, epoch, n)[offset:offset + global_batch]
        offset += global_batch


def global_order(seen: list[list[int]], global_batch: int, steps: int) -> list[int]:
    """The samples `steps` global batches trained, in order, from what each rank saw (rank
    r's list holds its contiguous share of every batch, one batch after the other)."""
    share = global_batch // len(seen)
    return [i for step in range(steps) for mine in seen
            for i in mine[step * share:(step + 1) * share]]


def reference(steps: int, global_batch: int, seed: int = 7, clip: float = 0.0,
              skip: frozenset[int] = frozenset()) -> tuple[nn.Module, list[int]]:
    """One process, plain PyTorch: the documented global order, full-batch mean loss."""
    torch.manual_seed(derive_seed("build", seed))
    data = IndexedData()
    model = make_model()
    opt = make_optimizer(model.parameters())
    order: list[int] = []
    for step, ids in enumerate(global_batches(steps, global_batch, seed)):
        order += ids.tolist()
        opt.zero_grad()
        nn.functional.mse_loss(model(data.x[ids]), data.y[ids]).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if step not in skip:
            opt.step()
    return model, order
