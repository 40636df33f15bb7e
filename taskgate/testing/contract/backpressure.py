"""Contract: back-pressure -- ``Submit.max_pending`` counted in the store, atomic with the insert.

A submit naming a limited queue stores its batch only when the queue's pending, retrying and
blocked tasks plus the batch's tasks for it stay within the limit; otherwise it raises
`QueueFullError` (the queue, the limit, the count, the batch's share) having stored nothing.
Running and final tasks do not count; other queues are not touched.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial

import pytest

from taskgate.brokers.base import Broker, FailureKind, NewTask
from taskgate.brokers.params import Submit
from taskgate.errors import QueueFullError, TaskNotFoundError
from taskgate.task import Filter, Status
from taskgate.testing import steps
from taskgate.testing.contract._fixtures import BrokerFactory
from taskgate.testing.contract._support import RACE_ROUNDS, claim_one, new_task, race, stored_state, submit

__all__ = ["BackPressureContract"]

RACERS = 8
RACE_LIMIT = 3


def _limited(broker: Broker, tasks: list[NewTask], **limits: int) -> list[Status]:
    """Submit ``tasks`` under ``limits`` (queue -> max_pending); their statuses on arrival."""
    return broker.submit(Submit(tuple(tasks), max_pending=tuple(sorted(limits.items())))).statuses


def _assert_full(broker: Broker, tasks: list[NewTask], *, queue: str, limit: int, waiting: int) -> None:
    """The submit of ``tasks`` under ``queue``'s ``limit`` is refused, naming the figures, and
    stores nothing."""
    before = stored_state(broker)
    with pytest.raises(QueueFullError, match=queue) as raised:
        _limited(broker, tasks, **{queue: limit})
    full = raised.value
    assert (full.queue, full.max_pending, full.waiting) == (queue, limit, waiting)
    assert full.adding == sum(1 for task in tasks if task.queue == queue)
    assert stored_state(broker) == before
    for task in tasks:
        with pytest.raises(TaskNotFoundError):
            broker.get(task.id)


class BackPressureContract:
    """``Submit.max_pending``: a queue's waiting tasks counted with the insert, in one unit."""

    def test_a_submit_within_the_limit_is_stored_and_the_next_is_refused(self, broker: Broker) -> None:
        for _ in range(3):
            assert _limited(broker, [new_task()], q=3) == [Status.PENDING]
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)
        assert steps.queue_length(broker, "q") == 3

    def test_pending_retrying_and_blocked_tasks_all_count(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        submit(broker, delay=timedelta(hours=1))  # pending, not due yet
        submit(broker)
        lease = claim_one(broker)
        steps.retry(
            broker, lease.task.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(hours=1)
        )
        submit(broker, depends_on=(parent.id,))  # blocked
        statuses = {t.status for t in broker.list(Filter(queue="q"))}
        assert statuses == {Status.PENDING, Status.RETRYING, Status.BLOCKED}
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)
        assert _limited(broker, [new_task()], q=4) == [Status.PENDING]

    def test_running_and_final_tasks_do_not_count(self, broker: Broker) -> None:
        for _ in range(4):
            submit(broker)
        running = claim_one(broker)
        completed = claim_one(broker)
        steps.ack(broker, completed.task.id, completed.token, None)
        failed = claim_one(broker)
        steps.fail(broker, failed.task.id, failed.token, kind=FailureKind.BUSINESS, error="x")
        broker.cancel(submit(broker).id)
        assert broker.get(running.task.id).status is Status.RUNNING
        # One pending task is left: one more fits under 2, none under 1.
        assert _limited(broker, [new_task()], q=2) == [Status.PENDING]
        _assert_full(broker, [new_task()], queue="q", limit=2, waiting=2)

    def test_a_batch_crossing_the_limit_stores_none_of_it(self, broker: Broker) -> None:
        submit(broker)
        _assert_full(broker, [new_task(), new_task(), new_task()], queue="q", limit=3, waiting=1)
        assert _limited(broker, [new_task(), new_task()], q=3) == [Status.PENDING] * 2
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)

    def test_a_batchs_tasks_blocked_on_each_other_count(self, broker: Broker) -> None:
        first = new_task()
        batch = [first, new_task(depends_on=(first.id,)), new_task(depends_on=(first.id,))]
        _assert_full(broker, batch, queue="q", limit=2, waiting=0)
        assert _limited(broker, batch, q=3) == [Status.PENDING, Status.BLOCKED, Status.BLOCKED]
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)

    def test_other_queues_are_not_limited(self, broker: Broker) -> None:
        submit(broker)
        _assert_full(broker, [new_task()], queue="q", limit=1, waiting=1)
        # A limit names its queue only: a batch without tasks of it is not counted against it.
        assert _limited(broker, [new_task(queue="other")], q=1) == [Status.PENDING]
        assert _limited(broker, [new_task(queue="other")], other=2, q=1) == [Status.PENDING]
        mixed = [new_task(queue="other"), new_task(queue="third")]
        _assert_full(broker, mixed, queue="other", limit=2, waiting=2)
        assert steps.queue_length(broker, "q") == 1

    def test_a_claim_makes_room(self, broker: Broker) -> None:
        submit(broker)
        submit(broker)
        _assert_full(broker, [new_task()], queue="q", limit=2, waiting=2)
        claim_one(broker)
        assert _limited(broker, [new_task()], q=2) == [Status.PENDING]

    def test_canceling_a_blocked_or_pending_task_makes_room(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        blocked = submit(broker, depends_on=(parent.id,))
        grandchild = submit(broker, depends_on=(blocked.id,))
        pending = submit(broker)
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)
        broker.cancel(blocked.id)  # and its blocked child with it (cascade)
        assert broker.get(grandchild.id).status is Status.CANCELED
        assert _limited(broker, [new_task(), new_task()], q=3) == [Status.PENDING] * 2
        broker.cancel(pending.id)
        assert _limited(broker, [new_task()], q=3) == [Status.PENDING]
        _assert_full(broker, [new_task()], queue="q", limit=3, waiting=3)

    def test_a_blocked_task_woken_still_counts_as_pending(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        child = submit(broker, depends_on=(parent.id,))
        lease = claim_one(broker, "parents")
        steps.ack(broker, parent.id, lease.token, None)
        assert broker.get(child.id).status is Status.PENDING
        _assert_full(broker, [new_task()], queue="q", limit=1, waiting=1)

    def test_a_submit_without_limits_is_not_counted(self, broker: Broker) -> None:
        submit(broker)
        submit(broker)
        assert steps.enqueue_statuses(broker, [new_task()]) == [Status.PENDING]
        # Three wait: the count stops at the limit.
        _assert_full(broker, [new_task()], queue="q", limit=2, waiting=2)

    def test_racing_submits_never_pass_the_limit_together(self, broker_factory: BrokerFactory) -> None:
        main = broker_factory()
        racers = [broker_factory() for _ in range(RACERS)]
        for n in range(RACE_ROUNDS):
            queue = f"race-{n}"
            outcomes = race(
                [partial(_limited, b, [new_task(queue=queue)], **{queue: RACE_LIMIT}) for b in racers]
            )
            stored = [o for o in outcomes if o.ok]
            refused = [o for o in outcomes if isinstance(o.error, QueueFullError)]
            assert len(stored) == RACE_LIMIT, [o.error for o in outcomes if not o.ok]
            assert len(refused) == RACERS - RACE_LIMIT
            assert steps.queue_length(main, queue) == RACE_LIMIT
