"""Streaming DiLoCo's parts that need no process group: the fragments, the int8
outer gradients, the plan's validation and what a resume may change."""

from __future__ import annotations

import itertools

import pytest
import torch

import tandem
from tandem.config import validate
from tandem.errors import UsageError
from tandem.parallel.outer_sum import dequantise, quantise
from tandem.parallel.streaming import slices
from tandem.trainer.resume_rules import plan_state_kept


def test_fragments_are_equal_contiguous_runs_that_may_end_inside_a_tensor() -> None:
    sizes = [384, 32, 96, 3]
    runs = slices(sizes, 2)
    assert runs == [[(0, 0, 257)], [(0, 257, 384), (1, 0, 32), (2, 0, 96), (3, 0, 3)]]
    for parts in (1, 3, 4, 7):
        runs = slices(sizes, parts)
        lengths = [sum(b - a for _, a, b in run) for run in runs]
        assert max(lengths) - min(lengths) <= 1 and sum(lengths) == sum(sizes)
        pieces = [piece for run in runs for piece in run]  # in order, end to end
        for (i, _, b), (j, a, _) in itertools.pairwise(pieces):
            assert (j, a) == ((i, b) if b < sizes[i] else (i + 1, 0))
    with pytest.raises(ValueError, match="plan.fragments: 6 must be between 1 and .* \\(5\\)"):
        slices([2, 3], 6)


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


def _plan(strategy: str, fragments: int = 4) -> tandem.Config:
    cfg = tandem.Config()
    cfg.plan.strategy, cfg.plan.fragments = strategy, fragments
    return cfg


def test_a_resume_keeps_the_same_plans_state_and_replicas_only_as_they_were() -> None:
    assert plan_state_kept(_plan("ddp"), _plan("ddp"), 2, 4)
    assert plan_state_kept(_plan("diloco"), _plan("diloco"), 2, 2)
    # Another plan's state: the new plan's starts from the loaded weights.
    assert not plan_state_kept(_plan("ddp"), _plan("streaming_diloco"), 2, 2)
    assert not plan_state_kept(_plan("localsgd"), _plan("diloco"), 2, 2)
    assert plan_state_kept(_plan("streaming_diloco"), _plan("streaming_diloco"), 2, 2)
    for new, world in ((_plan("ddp"), 2), (_plan("streaming_diloco"), 4),
                       (_plan("streaming_diloco", 2), 2)):
        with pytest.raises(UsageError, match="resume it with the same plan on 2 processes"):
            plan_state_kept(_plan("streaming_diloco"), new, 2, world)
