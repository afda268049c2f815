"""The resolve shim's sample cost: what one training sample takes to read, which tells
samples already in memory from samples loaded lazily."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from torch.utils.data import Dataset, TensorDataset

from tandem.tune import shim

LOAD_S = 0.005


class Lazy(Dataset):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> int:
        time.sleep(LOAD_S)  # a slow disk
        return i


def test_a_lazy_sample_costs_its_load_and_a_tensor_sample_far_less() -> None:
    lazy = shim.sample_cost(SimpleNamespace(train_data=Lazy))
    held = shim.sample_cost(SimpleNamespace(
        train_data=lambda: TensorDataset(torch.randn(1000, 8), torch.zeros(1000))))
    assert lazy is not None and held is not None
    assert lazy["sample_s"] >= LOAD_S and lazy["kind"] == "Lazy"
    assert 1 <= lazy["items"] <= shim.SAMPLE_ITEMS
    assert held["items"] == shim.SAMPLE_ITEMS and held["kind"] == "TensorDataset"
    assert held["sample_s"] < LOAD_S / 5


def test_a_dataset_that_cannot_be_indexed_gives_no_figure() -> None:
    def broken() -> Dataset:
        raise OSError("no such file")

    assert shim.sample_cost(SimpleNamespace(train_data=broken)) is None
    assert shim.sample_cost(SimpleNamespace(train_data=lambda: [])) is None
