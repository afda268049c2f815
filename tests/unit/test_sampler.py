import pytest
import torch

from tandem.data.sampler import (
    Cursor,
    GlobalBatchSampler,
    epoch_order,
    eval_shard,
    split_batch,
)


def _steps(world: int, accum: int, steps: int, n: int = 50, g: int = 12,
           cursor: Cursor | None = None) -> list[list[int]]:
    """The global batches that `world` ranks train on, rebuilt from their micro-batches."""
    iters = [iter(GlobalBatchSampler(dataset_len=n, global_batch=g, accum=accum, rank=r,
                                     world_size=world, seed=3, cursor=cursor or Cursor()))
             for r in range(world)]
    batches = []
    for _ in range(steps):
        batch: list[int] = []
        for it in iters:
            for _ in range(accum):
                batch += next(it)
        batches.append(batch)
    return batches


def test_global_order_does_not_depend_on_world_size_or_accumulation() -> None:
    one = _steps(1, 1, 10)
    assert _steps(2, 1, 10) == one
    assert _steps(4, 3, 10) == one
    assert _steps(3, 2, 10) == one


def test_each_epoch_is_a_permutation_with_the_short_tail_dropped() -> None:
    batches = _steps(2, 1, 8, n=50, g=12)  # 4 full batches per epoch, 2 samples dropped
    first = sum(batches[:4], [])
    assert len(set(first)) == 48 and set(first) <= set(range(50))
    assert first == epoch_order(3, 0, 50)[:48].tolist()
    assert sum(batches[4:], []) == epoch_order(3, 1, 50)[:48].tolist()
    assert batches[:4] != batches[4:]


def test_resuming_from_a_cursor_continues_the_stream() -> None:
    full = _steps(1, 1, 9)
    cursor = Cursor()
    for _ in range(5):
        cursor.take(12, 50)
    assert _steps(2, 2, 4, cursor=Cursor.from_state(cursor.state_dict())) == full[5:]


def test_split_batch_derives_micro_batch_and_accumulation() -> None:
    assert split_batch(64, 0, 4) == (16, 1)
    assert split_batch(64, 4, 4) == (4, 4)
    with pytest.raises(ValueError, match="not divisible by the world size"):
        split_batch(30, 0, 4)
    with pytest.raises(ValueError, match="train.micro_batch: 5 must divide"):
        split_batch(64, 5, 4)


def test_bad_dataset_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        GlobalBatchSampler(dataset_len=0, global_batch=4, accum=1, rank=0, world_size=1,
                           seed=0, cursor=Cursor())
    with pytest.raises(ValueError, match="larger than the training dataset"):
        GlobalBatchSampler(dataset_len=10, global_batch=16, accum=1, rank=0, world_size=1,
                           seed=0, cursor=Cursor())


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_eval_shards_cover_the_set_once(world: int) -> None:
    shards = [list(eval_shard(23, r, world)) for r in range(world)]
    assert sum(shards, []) == list(range(23))


def test_epoch_order_is_seeded() -> None:
    assert torch.equal(epoch_order(1, 0, 30), epoch_order(1, 0, 30))
    assert not torch.equal(epoch_order(1, 0, 30), epoch_order(2, 0, 30))
