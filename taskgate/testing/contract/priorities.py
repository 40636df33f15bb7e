"""Contract: priorities (`NewTask.priority`).

Among a queue's due tasks a claim takes the highest priority first, then the earliest
``run_at``, then the smallest id -- on every claim path (plain, of some types, within a quota,
under shared and group limits). A task that is not due yet waits for its time, however high its
priority. A task keeps its priority through retries, requeues and reaps; a replay copies it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from taskgate.brokers.base import MAX_PRIORITY, MIN_PRIORITY, Broker, FailureKind, QuotaSpec
from taskgate.brokers.params import Claim, Claimed, QueueQuery, Replay, SharedLimits, Submit
from taskgate.clock import ManualClock
from taskgate.errors import QueueFullError
from taskgate.ids import new_id
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, new_task, stored_state, submit

__all__ = ["PriorityContract"]

BUDGET = QuotaSpec("prioritized", 100, timedelta(hours=1))


def _ids(claimed: Claimed) -> list[str]:
    return [lease.task.id for lease in claimed.leases]


def _claim(broker: Broker, limit: int, path: str, types: tuple[str, ...] | None = None) -> Claimed:
    """A claim of queue "q" by ``path``: plain, within `BUDGET`, or under shared limits."""
    if path == "quota":
        if not broker.capabilities.shared_quota:
            pytest.skip("broker does not declare capabilities.shared_quota")
        return broker.claim(Claim("q", limit, TTL, quota=BUDGET, types=types))
    if path == "shared":
        if not broker.capabilities.shared_limits:
            pytest.skip("broker does not declare capabilities.shared_limits")
        return broker.claim(Claim("q", limit, TTL, shared=SharedLimits(limit), types=types))
    return broker.claim(Claim("q", limit, TTL, types=types))


def _grouped(broker: Broker, limit: int, **limits: Any) -> Claimed:
    if not broker.capabilities.group_limits:
        pytest.skip("broker does not declare capabilities.group_limits")
    return broker.claim(Claim("q", limit, TTL, shared=SharedLimits(100, **limits)))


def _enqueue(broker: Broker, clock: ManualClock, *tasks: tuple[str, int]) -> None:
    """Enqueue ``(id, priority)`` tasks of queue "q", one microsecond apart (run_at in that order)."""
    for task_id, priority in tasks:
        steps.enqueue(broker, [new_task(id=task_id, priority=priority)])
        clock.advance(timedelta(microseconds=1))


class PriorityContract:
    """`NewTask.priority`: claim order, waiting for the time, keeping it, and its checks."""

    @pytest.mark.parametrize("path", ["plain", "quota", "shared"])
    def test_due_tasks_are_claimed_by_priority_then_run_at_then_id(
        self, broker: Broker, clock: ManualClock, path: str
    ) -> None:
        _enqueue(broker, clock, ("old-low", 0), ("top", MAX_PRIORITY), ("mid-1", 5), ("neg", -3))
        _enqueue(broker, clock, ("mid-2", 5), ("bottom", MIN_PRIORITY), ("new-low", 0))
        # Same priority and run_at: the smaller id first.
        steps.enqueue(broker, [new_task(id=i, priority=5, run_at=clock.now()) for i in ("mid-4", "mid-3")])
        claimed = _claim(broker, 3, path)
        assert _ids(claimed) == ["top", "mid-1", "mid-2"]
        assert [lease.task.priority for lease in claimed.leases] == [MAX_PRIORITY, 5, 5]
        rest = _ids(_claim(broker, 10, path))
        assert rest == ["mid-3", "mid-4", "old-low", "new-low", "neg", "bottom"]

    def test_a_higher_priority_task_not_yet_due_waits_for_its_time(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        later = submit(broker, id="later", priority=9, delay=timedelta(minutes=1))
        _enqueue(broker, clock, ("low-1", 0), ("low-2", 0))
        assert claim_one(broker).task.id == "low-1"
        clock.advance(timedelta(minutes=1))
        assert claim_one(broker).task.id == later.id  # due now: ahead of the older low one
        assert claim_one(broker).task.id == "low-2"

    @pytest.mark.parametrize("path", ["plain", "quota", "shared"])
    def test_a_claim_of_some_types_takes_them_by_priority(
        self, broker: Broker, clock: ManualClock, path: str
    ) -> None:
        for task_id, kind, priority in [
            ("a-low", "a", 0),
            ("x-top", "x", 9),
            ("b-mid", "b", 3),
            ("a-top", "a", 7),
            ("b-neg", "b", -1),
        ]:
            steps.enqueue(broker, [new_task(id=task_id, type=kind, priority=priority)])
            clock.advance(timedelta(microseconds=1))
        assert _ids(_claim(broker, 1, path, ("b",))) == ["b-mid"]
        assert _ids(_claim(broker, 10, path, ("a", "b"))) == ["a-top", "a-low", "b-neg"]
        assert broker.get("x-top").status is Status.PENDING

    def test_a_claim_under_group_limits_takes_by_priority_passing_over_full_groups(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        for task_id, group, priority in [
            ("b-low", "b", 0),
            ("a-1", "a", 5),
            ("a-2", "a", 5),
            ("a-3", "a", 5),
            ("c-mid", "c", 2),
            ("none-low", None, 0),
        ]:
            steps.enqueue(broker, [new_task(id=task_id, group=group, priority=priority)])
            clock.advance(timedelta(microseconds=1))
        first = _grouped(broker, 2, group_workers=1)
        assert _ids(first) == ["a-1", "c-mid"]  # a's other two wait for its slot
        assert _ids(_grouped(broker, 10, group_workers=1)) == ["b-low", "none-low"]
        assert broker.get("a-2").status is Status.PENDING

    def test_a_claim_under_group_limits_finds_a_lower_priority_behind_a_deep_full_group(
        self, broker: Broker
    ) -> None:
        # Ids padded to sort in submit order: the claim order of tasks due at the same time.
        ahead = [new_task(id=f"a-{i:04}", group="a", priority=5) for i in range(300)]
        behind = [new_task(id="b-0", group="b", priority=-1), new_task(id="c-0", group="c", priority=3)]
        steps.enqueue(broker, [*ahead, *behind])
        assert _ids(_grouped(broker, 2, group_workers=1)) == ["a-0000", "c-0"]
        assert _ids(_grouped(broker, 2, group_workers=1)) == ["b-0"]
        assert broker.get("a-0299").status is Status.PENDING

    def test_a_retried_requeued_or_reaped_task_keeps_its_priority(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        submit(broker, id="low", priority=0)
        clock.advance(timedelta(seconds=1))
        high = submit(broker, id="high", priority=4)
        lease = claim_one(broker)
        assert lease.task.id == high.id
        retried = steps.retry(
            broker, high.id, lease.token, kind=FailureKind.BUSINESS, error="e", delay=timedelta(0)
        )
        assert (retried.status, retried.priority) == (Status.RETRYING, 4)
        lease = claim_one(broker)  # due later than "low", yet first
        assert lease.task.id == high.id
        assert steps.requeue(broker, high.id, lease.token).priority == 4
        lease = claim_one(broker)
        assert lease.task.id == high.id
        clock.advance(TTL + timedelta(seconds=1))
        (reaped,) = broker.reap(lease_lost_max=3)
        assert (reaped.id, reaped.status, reaped.priority) == (high.id, Status.PENDING, 4)
        assert claim_one(broker).task.id == high.id
        assert claim_one(broker).task.id == "low"

    def test_a_replay_copies_the_priority_of_each_execution(self, broker: Broker, clock: ManualClock) -> None:
        parent = submit(broker, id="parent", priority=6)
        child = submit(broker, id="child", priority=-2, depends_on=("parent",))
        broker.cancel(parent.id)
        assert broker.get(child.id).status is Status.CANCELED
        new_parent, new_child = new_id(), new_id()
        replayed = broker.replay(Replay(parent.id, new_parent, descendants=((child.id, new_child),)))
        assert (replayed.priority, broker.get(new_parent).priority) == (6, 6)
        assert broker.get(new_child).priority == -2
        plain = submit(broker, id="plain")
        broker.cancel(plain.id)
        assert steps.replay(broker, plain.id, new_id=new_id()).priority == 0

    def test_every_snapshot_shows_the_priority(self, broker: Broker) -> None:
        (stored, default) = steps.enqueue(broker, [new_task(id="p", priority=-7), new_task(id="d")])
        assert (stored.priority, default.priority) == (-7, 0)
        assert broker.get("p").priority == -7
        assert {t.id: t.priority for t in broker.list(Filter(queue="q"))} == {"p": -7, "d": 0}
        lease = claim_one(broker)
        assert (lease.task.id, lease.task.priority) == ("d", 0)
        assert steps.ack(broker, lease.task.id, lease.token).priority == 0
        assert steps.ack(broker, "p", claim_one(broker).token).priority == -7

    def test_a_batch_keeps_each_tasks_own_priority(self, broker: Broker) -> None:
        tasks = [new_task(id=f"t{n}", priority=n % 3) for n in range(6)]
        steps.enqueue(broker, tasks)
        assert [lease.task.id for lease in steps.claim(broker, "q", 6, TTL)] == [
            "t2",
            "t5",
            "t1",
            "t4",
            "t0",
            "t3",
        ]

    def test_the_backlog_and_a_cancel_count_every_priority(self, broker: Broker, clock: ManualClock) -> None:
        _enqueue(broker, clock, ("low", 0), ("high", 8), ("neg", -8))
        submit(broker, id="later", priority=3, delay=timedelta(hours=1))
        assert broker.queue_state(QueueQuery("q")).queue_len == 4
        broker.cancel("high")
        assert broker.queue_state(QueueQuery("q")).queue_len == 3
        assert [lease.task.id for lease in steps.claim(broker, "q", 10, TTL)] == ["low", "neg"]
        assert broker.queue_state(QueueQuery("q")).queue_len == 1

    def test_back_pressure_counts_the_waiting_tasks_of_every_priority(self, broker: Broker) -> None:
        steps.enqueue(broker, [new_task(id="high", priority=5), new_task(id="low", priority=-5)])
        limited = Submit((new_task(id="third"),), max_pending=(("q", 3),))
        assert broker.submit(limited).statuses == [Status.PENDING]
        with pytest.raises(QueueFullError):
            broker.submit(Submit((new_task(id="fourth", priority=9),), max_pending=(("q", 3),)))
        assert [lease.task.id for lease in steps.claim(broker, "q", 10, TTL)] == ["high", "third", "low"]

    @pytest.mark.parametrize(
        ("priority", "error"),
        [
            (True, TypeError),
            ("1", TypeError),
            (1.0, TypeError),
            (None, TypeError),
            (MAX_PRIORITY + 1, ValueError),
            (MIN_PRIORITY - 1, ValueError),
        ],
    )
    def test_a_bad_priority_raises_naming_it_and_stores_nothing(
        self, broker: Broker, priority: object, error: type[Exception]
    ) -> None:
        submit(broker, id="kept")
        before = stored_state(broker)
        with pytest.raises(error, match="priority"):
            steps.enqueue(broker, [new_task(priority=priority)])
        assert stored_state(broker) == before
