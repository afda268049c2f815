"""Joint training on several named data sources: each with its share of the sample
stream (a weight, or a temperature over the sources' sizes), its own loss, and
optionally its own head of the model's outputs and its own metrics.

`Mixture` is what a Task is given: `train_data=mixture.train`, `eval_data=mixture.eval`,
`loss=mixture.loss`. Its training dataset is the sources' samples side by side; its
order (`mixorder`) is a pure function of (seed, epoch, position) that the run's global
sampler walks instead of a permutation, so the mixture's sequence is the same at every
world size and after a resume at another one.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.utils.data import Dataset

from tandem.data.loader import batch_size, collate_of
from tandem.data.memory import join
from tandem.data.mixorder import apportion, mixture_epoch, probabilities

LossFn = Callable[[Any, Any], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Source:
    """One named data source of a mixture.

    `train` (and `eval`, optional) are zero-argument dataset factories. `loss(outputs,
    batch)` and each of `metrics` see this source's samples only, collated by its dataset's
    own `collate_fn` (else torch's default_collate), and the model's outputs for them: the
    rows of the outputs (of every tensor in them), or of `outputs[head]` when `head` names
    an entry of a dict of outputs. `weight` is its share of the training stream relative
    to the other sources' (all or none of them weighted).
    """

    name: str
    train: Callable[[], Dataset]
    loss: LossFn
    eval: Callable[[], Dataset] | None = None
    weight: float | None = None
    metrics: Mapping[str, Callable[[Any, Any], Any]] = field(default_factory=dict)
    head: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"tandem.Source: name {self.name!r} must be a non-empty string "
                             "without '/' (it names the source's metrics: task/NAME/loss)")
        for what in ("train", "loss"):
            if not callable(getattr(self, what)):
                raise ValueError(f"tandem.Source {self.name!r}: {what} must be callable, got "
                                 f"{getattr(self, what)!r}")
        if self.eval is not None and not callable(self.eval):
            raise ValueError(f"tandem.Source {self.name!r}: eval must be a dataset factory "
                             f"or None, got {self.eval!r}")
        if self.weight is not None and (isinstance(self.weight, bool) or not (
                isinstance(self.weight, int | float) and 0 < self.weight < float("inf"))):
            raise ValueError(f"tandem.Source {self.name!r}: weight {self.weight!r} must be a "
                             "finite number > 0 (its share relative to the others'); leave "
                             "the source out of the mixture to drop it")
        for key, fn in self.metrics.items():
            if not callable(fn) or "/" in key:
                raise ValueError(f"tandem.Source {self.name!r}: metrics[{key!r}] must be "
                                 "callable and named without '/'")


class MixedBatch(NamedTuple):
    """A micro-batch of a mixture: its samples grouped by source, in the mixture's order.

    `input` is every sample's input (a sample's first item, or its "input" entry),
    concatenated over the sources, so the model runs once on the micro-batch (the default
    forward calls `model(batch.input)`); `source` holds each row's source number; `parts`
    each present source's samples, collated by its own collate, by name.
    """

    input: Any
    source: torch.Tensor
    parts: dict[str, Any]


def _input_of(batch: Any) -> Any:
    if isinstance(batch, dict):
        if "input" not in batch:
            raise ValueError(f"tandem.Mixture: a dict sample (keys {sorted(batch)}) must hold "
                             "the model's input under 'input'")
        return batch["input"]
    if isinstance(batch, tuple | list):
        return batch[0]
    return batch


def rows(outputs: Any, start: int, stop: int) -> Any:
    """Rows start:stop of every tensor in `outputs` (a tensor, dict, tuple or list)."""
    if isinstance(outputs, torch.Tensor):
        return outputs[start:stop]
    if isinstance(outputs, dict):
        return {k: rows(v, start, stop) for k, v in outputs.items()}
    if isinstance(outputs, tuple | list):
        picked = [rows(v, start, stop) for v in outputs]
        return type(outputs)(*picked) if hasattr(outputs, "_fields") else type(outputs)(picked)
    return outputs


class MixedDataset(Dataset):
    """The sources' datasets side by side (item i of source k is number offset_k + i),
    with the mixture's order and collate."""

    def __init__(self, mixture: Mixture, datasets: Sequence[Dataset], probs: Sequence[float]
                 ) -> None:
        self.mixture, self.datasets, self.probs = mixture, list(datasets), list(probs)
        self.sizes = [len(d) for d in datasets]  # type: ignore[arg-type]
        self.offsets = [sum(self.sizes[:k]) for k in range(len(self.sizes))]
        self.collates = [collate_of(d) for d in datasets]
        self.counts = apportion(len(self), self.probs)
        for source, count in zip(mixture.sources, self.counts, strict=True):
            if count == 0:
                raise ValueError(
                    f"tandem.Mixture: source {source.name!r} gets no sample of an epoch of "
                    f"{len(self)} (its share {self.probs[self.names.index(source.name)]:.2e} "
                    "is below one sample in it); raise its weight or drop it")

    @property
    def names(self) -> list[str]:
        """The sources' names, in the mixture's order."""
        return [s.name for s in self.mixture.sources]

    def __len__(self) -> int:
        return sum(self.sizes)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        k = bisect.bisect_right(self.offsets, index) - 1
        return k, self.datasets[k][index - self.offsets[k]]

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """The item numbers of mixture epoch `epoch`, in stream order (`mixorder`)."""
        source, sample = mixture_epoch(seed, epoch, self.sizes, self.counts)
        return torch.tensor(self.offsets, dtype=torch.int64)[source] + sample

    def collate_fn(self, samples: list[tuple[int, Any]]) -> MixedBatch:
        """One micro-batch: the samples grouped by source, each group collated by its own
        collate, the inputs concatenated in the same order."""
        parts: dict[str, Any] = {}
        numbers: list[int] = []
        for k, name in enumerate(self.names):
            mine = [sample for source, sample in samples if source == k]
            if mine:
                parts[name] = self.collates[k](mine)
                numbers += [k] * len(mine)
        inputs = [_input_of(part) for part in parts.values()]
        try:
            joined = inputs[0] if len(inputs) == 1 else join(inputs)
        except (RuntimeError, TypeError) as err:
            raise ValueError("tandem.Mixture: the sources' inputs cannot be concatenated into "
                             f"one batch ({err}); the model runs once on a micro-batch, so "
                             "every source's input must have the same shape beyond the "
                             "batch dimension") from err
        return MixedBatch(joined, torch.tensor(numbers, dtype=torch.int64), parts)

    def reweighted(self, weights: Mapping[str, float] | None = None,
                   temperature: float | None = None) -> MixedDataset:
        """The same datasets with other shares (`Mixture.reweighted`)."""
        mixture = self.mixture.reweighted(weights, temperature)
        probs = probabilities(self.sizes, [s.weight for s in mixture.sources], temperature,
                              mixture.names)
        return MixedDataset(mixture, self.datasets, probs)

    def part(self, k: int) -> Dataset:
        """Source k's samples alone, as items of this dataset (for evaluation per source)."""
        return _Part(self, k)


class _Part(Dataset):
    def __init__(self, mixed: MixedDataset, k: int) -> None:
        self.mixed, self.k = mixed, k
        self.collate_fn = mixed.collate_fn

    def __len__(self) -> int:
        return self.mixed.sizes[self.k]

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return self.k, self.mixed.datasets[self.k][index]


class Mixture:
    """Several named sources trained jointly: a Task takes `train_data=mixture.train`,
    `eval_data=mixture.eval` and `loss=mixture.loss`.

    Each source's share of the training stream is its `weight` (normalised), or with
    `temperature` T proportional to its size^(1/T) (T5: 1 = by size, larger = flatter),
    or with neither proportional to its size. The shares hold in any window of the
    stream to within a few samples (`mixorder`). The run records each source's training
    loss (`task/NAME/loss`), and evaluates each source's eval data on its own
    (`task/NAME/eval_loss`, `task/NAME/METRIC` for the source's metrics).
    """

    def __init__(self, sources: Sequence[Source], temperature: float | None = None) -> None:
        sources = list(sources)
        if not sources:
            raise ValueError("tandem.Mixture: give at least one tandem.Source")
        for s in sources:
            if not isinstance(s, Source):
                raise ValueError(f"tandem.Mixture: {s!r} is not a tandem.Source")
        names = [s.name for s in sources]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"tandem.Mixture: source names {repeated} are given twice; "
                             "each source needs its own name")
        if temperature is not None and not (isinstance(temperature, int | float)
                                            and 0 < temperature < float("inf")):
            raise ValueError(f"tandem.Mixture: temperature {temperature!r} must be a finite "
                             "number > 0 (1: shares by size; larger: flatter)")
        self.sources, self.temperature = sources, temperature
        # Weights and a temperature together, or weights for some sources only: refused
        # now, not when the datasets are built in every process.
        probabilities([1] * len(sources), [s.weight for s in sources], temperature, names)

    @property
    def names(self) -> list[str]:
        """The sources' names, in order."""
        return [s.name for s in self.sources]

    def source(self, name: str) -> Source:
        """The source called `name`; ValueError naming the known ones."""
        for s in self.sources:
            if s.name == name:
                return s
        raise ValueError(f"tandem.Mixture: no source is called {name!r}; the sources are "
                         f"{self.names}")

    def reweighted(self, weights: Mapping[str, float] | None = None,
                   temperature: float | None = None) -> Mixture:
        """The same sources with other shares: a weight for every source by name, or a
        temperature."""
        if weights is not None:
            for name in weights:
                self.source(name)
            missing = [n for n in self.names if n not in weights]
            if missing:
                raise ValueError(f"tandem.Mixture: no weight for sources {missing}; give "
                                 f"every source of {self.names} one")
        return Mixture([Source(name=s.name, train=s.train, loss=s.loss, eval=s.eval,
                               weight=None if weights is None else weights[s.name],
                               metrics=s.metrics, head=s.head) for s in self.sources],
                       temperature)

    def train(self) -> MixedDataset:
        """The training dataset: every source's `train()`, with the mixture's order."""
        datasets = [_built(s.name, "train", s.train) for s in self.sources]
        sizes = [len(d) for d in datasets]  # type: ignore[arg-type]
        probs = probabilities(sizes, [s.weight for s in self.sources], self.temperature,
                              self.names)
        return MixedDataset(self, datasets, probs)

    def eval(self) -> MixedDataset | None:
        """The evaluation dataset: every source's `eval()` (each evaluated on its own), or
        None when no source has one. Sources without eval data are not evaluated."""
        have = [s for s in self.sources if s.eval is not None]
        if not have:
            return None
        part = Mixture(have) if len(have) < len(self.sources) else self
        datasets = [_built(s.name, "eval", s.eval) for s in have]  # type: ignore[arg-type]
        return MixedDataset(part, datasets, [1.0 / len(have)] * len(have))

    def loss(self, outputs: Any, batch: MixedBatch) -> torch.Tensor:
        """The mean loss over the micro-batch's samples: each source's loss of its rows,
        weighted by its rows. Of a dict of outputs, the entries no source of the batch
        reads (the heads of sources absent from it) enter with weight 0, so every head has
        a gradient at every step (DDP needs one)."""
        per = self.source_losses(outputs, batch)
        n = batch_size(batch)
        total = sum(loss * count / n for loss, count in per.values())
        if isinstance(outputs, dict):
            read = {self.source(name).head for name in per}
            for key, value in outputs.items():
                if key not in read and isinstance(value, torch.Tensor) and value.requires_grad:
                    total = total + 0.0 * value.float().sum()
        return total  # type: ignore[return-value]

    def source_losses(self, outputs: Any, batch: MixedBatch) -> dict[str, tuple[torch.Tensor,
                                                                               int]]:
        """Each present source's (mean loss over its rows, its number of rows)."""
        if not isinstance(batch, MixedBatch):
            raise ValueError(f"tandem.Mixture.loss takes a mixture's batch; got a "
                             f"{type(batch).__name__}: give the Task train_data=mixture.train "
                             "(and eval_data=mixture.eval), and no Task.collate")
        out: dict[str, tuple[torch.Tensor, int]] = {}
        start = 0
        for name, part in batch.parts.items():
            count = batch_size(part)
            s = self.source(name)
            out[name] = (s.loss(self.outputs_of(s, outputs, start, start + count), part),
                         count)
            start += count
        return out

    @staticmethod
    def outputs_of(source: Source, outputs: Any, start: int, stop: int) -> Any:
        """The outputs `source` sees for rows start:stop of a batch."""
        if source.head is not None:
            if not isinstance(outputs, dict) or source.head not in outputs:
                keys = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
                raise ValueError(f"tandem.Source {source.name!r}: head {source.head!r} is "
                                 f"not an entry of the model's outputs ({keys})")
            outputs = outputs[source.head]
        return rows(outputs, start, stop)


def _built(name: str, what: str, factory: Callable[[], Dataset]) -> Dataset:
    dataset = factory()
    if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
        raise ValueError(f"tandem.Source {name!r}: {what}() returned a "
                         f"{type(dataset).__name__}; it must return a map-style dataset "
                         "(__len__ and __getitem__)")
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise ValueError(f"tandem.Source {name!r}: {what}() returned an empty dataset "
                         "(len == 0); a source needs samples")
    return dataset
