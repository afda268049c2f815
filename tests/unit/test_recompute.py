"""Activation checkpointing keeps fewer activations and the same gradients; compile skips."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from tandem.parallel import compiled
from tandem.parallel.recompute import checkpoint_blocks


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                           for _ in range(4)), nn.Linear(64, 1))


def _saved_bytes_and_grads(model: nn.Module, x: torch.Tensor) -> tuple[int, list[torch.Tensor]]:
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().mean()
    loss.backward()
    return saved, [p.grad.clone() for p in model.parameters()]


def test_checkpointing_saves_less_and_changes_nothing() -> None:
    x = torch.randn(32, 64)
    plain_bytes, plain_grads = _saved_bytes_and_grads(_model(), x)
    model = _model()
    names = [n for n, _ in model.named_parameters()]
    assert checkpoint_blocks(model) == 5
    assert [n for n, _ in model.named_parameters()] == names  # checkpoints interchangeable
    ac_bytes, ac_grads = _saved_bytes_and_grads(model, x)
    assert ac_bytes < plain_bytes / 2
    for a, b in zip(ac_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_checkpointing_needs_blocks() -> None:
    with pytest.raises(ValueError, match="no blocks"):
        checkpoint_blocks(nn.Linear(3, 3))


def test_compile_is_skipped_with_a_warning_where_it_cannot_work(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(compiled, "compile_problem", lambda device_type: "no C++ compiler")
    model = nn.Linear(3, 3)
    with caplog.at_level(logging.WARNING, logger="tandem"):
        assert not compiled.maybe_compile(model, torch.device("cpu"))
    assert "no C++ compiler" in caplog.text and "eagerly" in caplog.text
    assert model._compiled_call_impl is None  # still the eager module


def test_compile_problem_reports_a_failing_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(fn, **kwargs):  # noqa: ANN001, ANN003, ANN202
        raise RuntimeError("backend exploded\nlong trace")

    compiled.compile_problem.cache_clear()
    monkeypatch.setattr(torch, "compile", broken)
    try:
        assert compiled.compile_problem("cpu") == "RuntimeError: backend exploded"
    finally:
        compiled.compile_problem.cache_clear()


def test_fsdp_bytes_per_step_from_the_sizes() -> None:
    from tandem.parallel.fsdp import bytes_per_step

    model = nn.Linear(10, 10)  # 110 parameters, 440 bytes in fp32, all the root's
    # The root is gathered once a micro-batch (FSDP2 keeps it from forward to backward).
    assert bytes_per_step(model, 4, 2, True, None, None) == pytest.approx(0.75 * (440 * 2 + 440))
    assert bytes_per_step(model, 2, 1, False, torch.bfloat16, None) == pytest.approx(
        0.5 * (220 + 220))
