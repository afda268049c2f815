"""What a step's kept FLOP count is keyed on (`flops.step_signature`), and keeping it."""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tandem.monitor import flops


def _loss(out: torch.Tensor, batch: tuple) -> torch.Tensor:
    return out.sum()


def _model(width: int = 8) -> nn.Module:
    return nn.Sequential(nn.Linear(4, width), nn.ReLU(), nn.Linear(width, 2))


def test_the_same_step_has_the_same_signature_and_any_change_another() -> None:
    torch.manual_seed(0)
    batch = (torch.zeros(16, 4), torch.zeros(16, dtype=torch.long))
    sig = flops.step_signature(_model(), batch, [_loss], "fp32")
    assert sig is not None and sig == flops.step_signature(_model(), batch, [_loss], "fp32")
    others = {
        "width": flops.step_signature(_model(16), batch, [_loss], "fp32"),
        "batch size": flops.step_signature(_model(), (torch.zeros(32, 4), batch[1]),
                                           [_loss], "fp32"),
        "dtype": flops.step_signature(_model(), (batch[0].double(), batch[1]), [_loss],
                                      "fp32"),
        "setting": flops.step_signature(_model(), batch, [_loss], "bf16"),
        "dict batch": flops.step_signature(_model(), {"input": batch[0]}, [_loss], "fp32"),
    }
    assert sig not in others.values() and len(set(others.values())) == len(others), others
    # a partial is what it calls, with its arguments
    part = flops.step_signature(_model(), batch, [functools.partial(_loss)], "fp32")
    assert part is not None and part != sig
    assert part != flops.step_signature(_model(), batch, [functools.partial(_loss, 1)], "fp32")
    # what cannot be traced to a file is not kept at all: the caller counts
    assert flops.step_signature(_model(), batch, [torch.sum], "fp32") is None


def test_editing_the_file_that_defines_the_model_counts_again(tmp_path: Path) -> None:
    source = tmp_path / "edited_model.py"
    source.write_text("from torch import nn\n\nclass Net(nn.Module):\n"
                      "    def __init__(self):\n        super().__init__()\n"
                      "        self.fc = nn.Linear(4, 2)\n\n"
                      "    def forward(self, x):\n        return self.fc(x)\n")
    spec = importlib.util.spec_from_file_location("edited_model", source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["edited_model"] = module
    try:
        spec.loader.exec_module(module)
        batch = torch.zeros(3, 4)
        before = flops.step_signature(module.Net(), batch, [], "fp32")
        st = source.stat()
        os.utime(source, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
        after = flops.step_signature(module.Net(), batch, [], "fp32")
    finally:
        sys.modules.pop("edited_model", None)
    assert before is not None and after is not None and before != after


def test_a_kept_count_is_read_back_and_a_broken_file_is_counted_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    model, batch = _model(), torch.randn(16, 4)
    sig = flops.step_signature(model, batch, [_loss], "fp32")
    assert flops.kept_flops(sig) is None
    counted = flops.count_flops(lambda: _loss(model(batch), ()).backward())
    # forward 2*16*(4*8 + 8*2) multiply-adds, backward twice that (weights and inputs,
    # less the first layer's input gradient)
    assert counted > 2 * 16 * (4 * 8 + 8 * 2)
    flops.keep_flops(sig, counted)
    assert flops.kept_flops(sig) == counted and flops.kept_flops(None) is None
    (tmp_path / flops.FLOPS_FILE).write_text("{not json")
    assert flops.kept_flops(sig) is None


def _keep_many(folder: str, worker: int) -> None:
    os.environ["TANDEM_CACHE_DIR"] = folder
    for i in range(25):
        flops.keep_flops(f"w{worker}-{i}", worker * 1000 + i)


def test_runs_that_keep_counts_at_once_lose_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four processes each keep 25 counts in the same file at the same time: each write
    reads, adds and replaces the file, so without a lock one write drops another's."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_keep_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
        assert p.exitcode == 0
    monkeypatch.setenv("TANDEM_CACHE_DIR", str(tmp_path))
    for w in range(4):
        for i in range(25):
            assert flops.kept_flops(f"w{w}-{i}") == w * 1000 + i, (w, i)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".flops.json-")]
