"""The MNIST-1D example's split is generated once per machine, then read from the cache:
the cached split is the generated one, and a damaged cache file is generated again."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import mnist1d_model  # noqa: E402

load = mnist1d_model._mnist1d.__wrapped__  # the uncached-in-memory function


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_cached_split_is_the_generated_one(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    fresh = mnist1d_model._generate()
    assert fresh["x"].shape == (4000, 1, 40) and fresh["x_test"].shape == (1000, 1, 40)
    first = load()  # generates and keeps it
    files = list(tmp_path.glob("mnist1d-*.pt"))
    assert len(files) == 1 and _equal(first, fresh)
    stamp = files[0].stat().st_mtime_ns
    second = load()  # read back, not generated again
    assert _equal(second, fresh) and files[0].stat().st_mtime_ns == stamp
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


@pytest.mark.parametrize("damage", [b"not a tensor file", b""])
def test_damaged_cache_is_generated_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          damage: bytes) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    first = load()
    path = next(tmp_path.glob("mnist1d-*.pt"))
    path.write_bytes(damage)
    again = load()
    assert _equal(again, first)
    assert _equal(torch.load(path, weights_only=True), first), "the file was rewritten"


def test_wrong_contents_are_generated_again(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    first = load()
    path = next(tmp_path.glob("mnist1d-*.pt"))
    torch.save({**first, "x": first["x"][:, :, :20]}, path)  # a readable, wrong split
    assert _equal(load(), first)
