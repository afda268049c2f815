"""The N-dimensional layout's ranks and the one batch split, against counts by hand."""

from __future__ import annotations

import itertools

import pytest
import torch

from tandem.data.batches import BatchPlan
from tandem.parallel.mesh import AXES, Layout, coords_of, layout


def test_coords_enumerate_the_mesh_last_axis_fastest() -> None:
    sizes = (2, 3, 1, 2)
    expected = list(itertools.product(*(range(s) for s in sizes)))
    assert [coords_of(r, sizes) for r in range(12)] == expected


@pytest.mark.parametrize("shard", [False, True])
def test_one_process_per_replica_layout_matches_the_world(shard: bool) -> None:
    for rank in range(4):
        place = layout(1, rank, 4, torch.device("cpu"), shard=shard)
        assert (place.dp_rank, place.dp_size, place.tp_rank, place.tp_size) == (rank, 4, 0, 1)
        assert place.size("pp") == 1 and place.mesh is None
        assert place.size("dp_shard" if shard else "dp_replicate") == 4


def test_data_rank_counts_over_both_data_axes() -> None:
    # 2 replicas x 2 shards x 2 tensor peers: ranks 0-7, the tensor axis fastest.
    sizes = (1, 2, 2, 2)
    seen = []
    for rank in range(8):
        place = Layout(sizes=sizes, coords=coords_of(rank, sizes))  # type: ignore[arg-type]
        seen.append((place.dp_rank, place.tp_rank))
        assert place.dp_size == 4 and place.tp_size == 2
    assert seen == [(r // 2, r % 2) for r in range(8)]
    assert AXES == ("pp", "dp_replicate", "dp_shard", "tp")


def test_layout_refuses_a_tp_that_does_not_divide() -> None:
    with pytest.raises(ValueError, match="plan.tp: 3 does not divide the 4 processes"):
        layout(3, 0, 4, torch.device("cpu"))


def test_batch_plan_splits_and_ramps() -> None:
    plan = BatchPlan.of(64, 4, 4, [(10, 32), (20, 48)])
    assert (plan.micro, plan.accum) == (4, 4)
    assert [plan.size_at(s) for s in (0, 9, 10, 19, 20)] == [64, 64, 32, 32, 48]
    assert [plan.accum_at(s) for s in (0, 10, 20)] == [4, 2, 3]
    assert plan.sizes == {64, 32, 48}
    assert BatchPlan.of(64, 0, 4).accum == 1


def test_batch_plan_refuses_a_ramp_batch_of_partial_micro_batches() -> None:
    with pytest.raises(ValueError, match="train.batch_ramp: batch 24 is not a multiple"):
        BatchPlan.of(64, 4, 4, [(10, 24)])
