"""Streaming DiLoCo's parts that need no process group: the fragments' cut, the int8
outer gradients and the plan's validation."""

from __future__ import annotations

import pytest
import torch

import tandem
from tandem.config import validate
from tandem.parallel.outer_sum import dequantise, quantise
from tandem.parallel.streaming import balanced_cuts


def test_fragments_are_contiguous_and_as_balanced_as_cuts_allow() -> None:
    assert balanced_cuts([10, 10, 10, 10], 2) == [0, 2, 4]
    assert balanced_cuts([10, 10, 10, 10], 4) == [0, 1, 2, 3, 4]
    # 100 | 1 1 1 1 is the best cut in two; every part keeps at least one tensor.
    assert balanced_cuts([100, 1, 1, 1, 1], 2) == [0, 1, 5]
    assert balanced_cuts([1, 1, 1, 1, 100], 3) == [0, 3, 4, 5]
    assert balanced_cuts([5, 3, 8, 2, 6, 4], 1) == [0, 6]
    with pytest.raises(ValueError, match="plan.fragments: 3 must be between 1 and .* \\(2\\)"):
        balanced_cuts([4, 4], 3)


def test_int8_outer_gradients_keep_each_tensor_within_half_a_step_of_its_scale() -> None:
    g = torch.Generator().manual_seed(0)
    sizes = [50, 7, 0, 30]
    flat = torch.cat([torch.randn(50, generator=g) * 1e-3, torch.randn(7, generator=g) * 10,
                      torch.zeros(0), torch.zeros(30)])
    q, scales = quantise(flat, sizes)
    assert q.dtype == torch.int8 and scales.shape == (4,)
    back = dequantise(q, scales, sizes)
    for part, orig, scale in zip(torch.split(back, sizes), torch.split(flat, sizes), scales,
                                 strict=True):
        if orig.numel():
            assert (part - orig).abs().max() <= scale / 2 + 1e-12
            assert orig.abs().max() == 0 or scale == orig.abs().max() / 127
    assert torch.equal(back[57:], torch.zeros(30))  # an all-zero tensor stays zero


@pytest.mark.parametrize(("plan", "message"), [
    ({"overlap_steps": 4}, "plan.overlap_steps: 4 must be < plan.sync_every \\(4\\)"),
    ({"fragments": 5}, "plan.fragments: 5 must be <= plan.sync_every \\(4\\)"),
    ({"merge_alpha": 1.0}, "plan.merge_alpha: 1.0 must be < 1"),
    ({"fragments": 0}, "plan.fragments"),
])
def test_bad_streaming_plans_are_refused_by_name(plan: dict, message: str) -> None:
    cfg = tandem.Config()
    cfg.plan.strategy, cfg.plan.sync_every = "streaming_diloco", 4
    for key, value in plan.items():
        setattr(cfg.plan, key, value)
    with pytest.raises(ValueError, match=message):
        validate(cfg)


def test_streaming_checkpoints_may_fall_between_meetings() -> None:
    cfg = tandem.Config()
    cfg.plan.strategy, cfg.plan.sync_every, cfg.checkpoint.every = "streaming_diloco", 4, 5
    validate(cfg)  # every replica is in the checkpoint
    cfg.plan.strategy = "diloco"
    with pytest.raises(ValueError, match="checkpoint.every: 5 must be a multiple"):
        validate(cfg)
