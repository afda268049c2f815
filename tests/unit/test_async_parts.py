"""The parts of bounded-staleness asynchronous training, on an in-process store: the log's
numbering, bound and outer steps against a plain computation; the share counters; the
config's checks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import tandem
from tandem.config import validate
from tandem.data.claims import SliceClaims
from tandem.parallel.async_log import StalenessLog

LR, MOMENTUM = 0.7, 0.9


def _workers(world: int, staleness: int) -> list[StalenessLog]:
    store = dist.HashStore()
    store.set("state", StalenessLog.initial(world))
    return [StalenessLog(store, r, world, staleness, torch.zeros(4), LR, MOMENTUM)
            for r in range(world)]


def _outer_steps(steps: list[list[tuple[torch.Tensor, int]]], world: int) -> torch.Tensor:
    """Plain outer Nesterov steps over (delta, staleness) pushes, each weighted 1/(1+tau),
    the momentum by their mean weight."""
    outer, velocity = torch.zeros(4), torch.zeros(4)
    for pushes in steps:
        g = sum(d / (1 + tau) for d, tau in pushes) / world
        m = MOMENTUM * sum(1 / (1 + tau) for _, tau in pushes) / len(pushes)
        velocity = m * velocity + g
        outer = outer - LR * (g + m * velocity)
    return outer


def test_a_slow_worker_is_asked_to_push_and_no_push_is_staler_than_the_bound() -> None:
    fast, other, slow = _workers(3, staleness=1)
    d = [torch.full((4,), float(k + 1)) for k in range(8)]
    # Two fast workers push and pull freely: with s = 1 a pull needs only the step before.
    assert fast.try_push(d[0]) == 0 and fast.can_pull(0)
    assert fast.pull() == 0
    assert other.try_push(d[1]) == 1 and other.pull() == 0
    assert fast.try_push(d[2]) == 2 and fast.pull() == 1  # step 0 is complete
    assert other.try_push(d[3]) == 3 and other.pull() == 1  # it had pulled version 0
    assert other.taus == {0: 1, 1: 1}
    assert fast.try_push(d[4]) == 4 and fast.pull() == 1
    # The slow worker, still at version 0, needs a place in step 1 (0 + s): the last one.
    assert not slow.needed()
    assert other.try_push(d[5]) is None  # would take it: refused, and the slow one is told
    assert slow.needed()
    assert slow.try_push(d[6]) == 5  # joins step 1 from version 0: staleness 1
    assert slow.taus == {1: 1} and not slow.needed()
    assert other.try_push(d[5]) == 6
    slow.pull()
    assert slow.version == 2
    want = _outer_steps([[(d[0], 0), (d[1], 0), (d[2], 0)],
                         [(d[3], 1), (d[4], 0), (d[6], 1)]], 3)
    torch.testing.assert_close(slow.outer, want)
    # The last, partial step of a finished log: its one push over the world size.
    slow.replay(3, partial=True)
    want = _outer_steps([[(d[0], 0), (d[1], 0), (d[2], 0)],
                         [(d[3], 1), (d[4], 0), (d[6], 1)], [(d[5], 1)]], 3)
    torch.testing.assert_close(slow.outer, want)


def test_staleness_zero_waits_for_every_worker_of_the_step() -> None:
    a, b = _workers(2, staleness=0)
    assert a.try_push(torch.ones(4)) == 0
    assert not a.can_pull(0)  # its step needs b's push
    assert b.try_push(torch.ones(4) * 3) == 1
    assert a.can_pull(0) and a.pull() == 1 and b.pull() == 1
    torch.testing.assert_close(a.outer, _outer_steps([[(torch.ones(4), 0),
                                                       (torch.ones(4) * 3, 0)]], 2))


def test_a_checkpoint_of_the_log_keeps_the_pushes_in_flight() -> None:
    a, b, c = _workers(3, staleness=1)
    d = [torch.full((4,), float(k + 1)) for k in range(4)]
    a.try_push(d[0]), b.try_push(d[1]), c.try_push(d[2]), a.pull()
    a.try_push(d[3])  # step 1 holds one push of three
    a.replay(a.counted() // 3)
    saved, applied = a.in_flight(), a.applied
    # A fresh store (a new process group) gets the log back; the step is completed there.
    fresh = _workers(3, staleness=1)
    for worker, old in zip(fresh, (a, b, c), strict=True):
        worker.outer.copy_(a.outer)
        worker.velocity.copy_(a.velocity)
        worker.restore(saved, applied, old.version)
    fresh[1].try_push(d[1]), fresh[2].try_push(d[2])
    fresh[0].replay(2)
    want = _outer_steps([[(d[0], 0), (d[1], 0), (d[2], 0)],
                         [(d[3], 0), (d[1], 1), (d[2], 1)]], 3)
    torch.testing.assert_close(fresh[0].outer, want)


def test_a_log_resumed_at_another_world_size_folds_what_was_in_flight() -> None:
    a, b, c = _workers(3, staleness=1)
    d = [torch.full((4,), float(k + 1)) for k in range(5)]
    a.try_push(d[0]), b.try_push(d[1]), c.try_push(d[2]), a.pull()
    a.try_push(d[3])  # step 1 holds one push of three; b and c trained on, unpushed
    a.replay(a.counted() // 3)
    saved, applied = a.in_flight(), a.applied
    # On 2 workers: the push in flight and the unpushed changes (b's from version 0, c's
    # from version 1) make step 1, over the 3 places it was numbered for ...
    fresh = _workers(2, staleness=1)
    for worker in fresh:
        worker.outer.copy_(a.outer)
        worker.velocity.copy_(a.velocity)
        worker.fold(saved, applied, 3, [(0, d[4]), (1, d[1])])
    want = _outer_steps([[(d[0], 0), (d[1], 0), (d[2], 0)],
                         [(d[3], 0), (d[4], 1), (d[1], 0)]], 3)
    for worker in fresh:
        torch.testing.assert_close(worker.outer, want)
        assert worker.applied == worker.version == 0
    # ... and a new log of 2 workers starts from that model: both push into its step 0.
    assert fresh[0].try_push(d[0]) == 0 and fresh[1].try_push(d[1]) == 1
    assert fresh[0].taus == {0: 1}


def test_shares_are_taken_once_and_a_straggler_s_are_taken_by_others() -> None:
    store = dist.HashStore()
    thief, straggler = (SliceClaims(store, r, 2, steal_after=2) for r in range(2))
    thief.reset(10)
    taken = [thief.claim(16) for _ in range(3)]  # its own shares of batches 10, 11, 12
    assert taken == [(10, 0), (11, 0), (12, 0)]
    assert thief.claim(16) == (10, 1)  # the other is more than 2 batches behind
    assert straggler.claim(16) == (11, 1)
    rest = iter(lambda: thief.claim(16), None)
    got = set(taken) | {(10, 1), (11, 1)} | set(rest)
    assert got == {(t, u) for t in range(10, 16) for u in range(2)}
    assert straggler.claim(16) is None and not straggler.available(16)
    # Synchronous (no stealing): each worker takes its own shares only.
    own = SliceClaims(store, 0, 2, steal_after=None)
    own.reset(0)
    assert [own.claim(2) for _ in range(3)] == [(0, 0), (1, 0), None]


@pytest.mark.parametrize(("section", "key", "value", "words"), [
    ("plan", "staleness", -1, "plan.staleness"),
    ("train", "batch_ramp", "0:32,10:64", "train.batch_ramp: plan.strategy 'async'"),
    ("train", "seq_ramp", "0:32,50:0", "train.seq_ramp: plan.strategy 'async'"),
    ("fault", "spike", "rollback", "fault.spike: 'rollback'"),
    ("fault", "nonfinite", "rollback", "fault.nonfinite: 'rollback'"),
])
def test_async_refuses_what_it_cannot_do(section: str, key: str, value: object,
                                         words: str) -> None:
    cfg = tandem.Config()
    cfg.plan.strategy, cfg.train.global_batch = "async", 64
    setattr(getattr(cfg, section), key, value)
    with pytest.raises(ValueError, match=words):
        validate(cfg)


def test_the_report_lists_each_worker_s_steps_pushes_and_staleness() -> None:
    from tandem.analyze.report import figures

    def rows(name: str, values: dict[tuple[int, int], float]) -> list[dict]:
        return [{"step": s, "rank": r, "name": name, "value": v, "time": 0.0}
                for (s, r), v in values.items()]

    groups = figures.by_name([
        *rows("async/local_steps", {(8, 0): 20, (8, 1): 4, (16, 0): 19, (16, 1): 5,
                                    (16, -1): 12}),
        *rows("async/pushes", {(8, 0): 5, (8, 1): 2, (16, 0): 5, (16, 1): 1}),
        *rows("async/early_pushes", {(8, 1): 1, (16, 1): 1}),
        *rows("async/staleness_mean", {(8, 0): 0.5, (16, 0): 0.25, (16, 1): 2.0}),
        *rows("async/staleness_max", {(16, 0): 1, (16, 1): 2}),
        *rows("async/fresh_share", {(16, 0): 0.75, (16, 1): 0.0}),
        *rows("comm/pull_wait_s", {(8, 0): 0.001, (16, 0): 0.003})])
    assert figures.async_workers(groups) == [
        ["0", "39", "10", "0", "0.25", "1", "75%", "2.00 ms"],
        ["1", "9", "3", "2", "2.00", "2", "0%", "-"]]
    assert figures.async_workers(figures.by_name([])) == []


def test_a_slow_fault_with_a_factor_sleeps_as_long_as_the_step_took(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tandem import faults

    clock, slept = iter([0.0, 10.0, 10.3, 20.0, 20.5, 30.0]), []
    monkeypatch.setattr(faults.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    fault = faults.Fault.parse({"rank": 1, "step": 2, "until": 4, "kind": "slow",
                                "phase": "optim", "factor": 1.0})
    plan = faults.FaultPlan([fault], rank=1, attempt=0)
    for step in (2, 3, 4):  # 4 is past `until`
        plan.hit("step", step)
        plan.hit("optim", step)
    assert slept == pytest.approx([0.3, 0.5])
