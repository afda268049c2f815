"""The sample-id audit against logs built from the documented order by hand."""

from __future__ import annotations

from tandem.data.sampler import epoch_order
from tandem.sched.service.sample_audit import audit

N, SEED = 50, 3


def _logs(plan: list[tuple[int, int, int]]) -> list[list[int]]:
    """Micro-batches of (steps, global batch, world size) phases, as ranks would log them:
    the cursor runs on over phases, a tail shorter than the batch is dropped per epoch."""
    out: list[list[int]] = []
    epoch, offset = 0, 0
    order = epoch_order(SEED, 0, N).tolist()
    for steps, batch, world in plan:
        for _ in range(steps):
            if offset + batch > N:
                epoch, offset = epoch + 1, 0
                order = epoch_order(SEED, epoch, N).tolist()
            share = batch // world
            for rank in range(world):
                out.append(order[offset + rank * share: offset + (rank + 1) * share])
            offset += batch
    return out


def test_resizes_and_batch_changes_are_clean() -> None:
    logs = _logs([(7, 12, 2), (5, 12, 1), (6, 8, 4), (4, 16, 2)])
    found = audit(reversed(logs), SEED, N)  # order of the log lines does not matter
    assert found.clean, found
    assert found.samples == 7 * 12 + 5 * 12 + 6 * 8 + 4 * 16
    assert all(0 <= tail < 16 for tail in found.tails)


def test_a_repeated_step_a_skipped_step_and_a_foreign_batch_are_found() -> None:
    logs = _logs([(10, 12, 2)])
    repeated = audit([*logs, logs[5]], SEED, N)
    assert (repeated.repeated, repeated.skipped) == (6, 0)
    skipped = audit(logs[:4] + logs[6:], SEED, N)  # step 2 (two micro-batches) lost
    assert (skipped.repeated, skipped.skipped) == (0, 12)
    shuffled = audit([*logs, [logs[0][1], logs[0][0], logs[0][2]]], SEED, N)
    assert shuffled.not_slices == 1


def test_a_long_run_whose_dropped_tails_add_up_to_epochs_is_audited_whole() -> None:
    # a global batch of 12 on 50 samples drops a tail of 2 each epoch: 400 steps are 100
    # epochs, four more than their 4,800 samples fill (96), so the last steps lie past
    # the epochs the sample count alone would look in (96 + 2)
    logs = _logs([(400, 12, 2)])
    found = audit(logs, SEED, N)
    assert found.clean, found
    assert (found.samples, found.epochs) == (400 * 12, 100)
    assert found.tails == (2,) * 99
    bad = audit([*logs, [logs[0][1], logs[0][0], logs[0][2]]], SEED, N)
    assert bad.not_slices == 1 and bad.samples == 400 * 12
