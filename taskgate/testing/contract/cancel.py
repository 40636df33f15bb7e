"""Contract: cancel in every state, and how a cancel mark meets the holder's next write."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.clock import ManualClock
from taskgate.errors import AlreadyFinalError, TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, submit

__all__ = ["CancelContract"]


class CancelContract:
    """Cancel per state (seed: CancelStates)."""

    def test_cancel_of_a_pending_task_cancels_it_at_once(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        clock.advance(1)
        canceled = broker.cancel(task.id)
        assert (canceled.status, canceled.finished_at) == (Status.CANCELED, clock.now())
        assert broker.get(task.id) == canceled
        assert steps.queue_length(broker, "q") == 0
        assert steps.claim(broker, "q", 1, TTL) == []

    def test_cancel_of_a_delayed_task_cancels_it_at_once(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker, delay=timedelta(seconds=10))
        assert broker.cancel(task.id).status is Status.CANCELED
        clock.advance(10)
        assert steps.claim(broker, "q", 1, TTL) == []

    def test_cancel_of_a_blocked_task_cancels_it_at_once(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        child = submit(broker, depends_on=(parent.id,))
        assert broker.cancel(child.id).status is Status.CANCELED
        assert broker.get(parent.id).status is Status.PENDING

    def test_cancel_of_a_retrying_task_cancels_it_at_once(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        steps.retry(broker, task.id, claim_one(broker).token, kind=FailureKind.BUSINESS, error="x", delay=TTL)
        canceled = broker.cancel(task.id)
        assert (canceled.status, canceled.attempts) == (Status.CANCELED, 1)
        clock.advance(TTL)
        assert steps.claim(broker, "q", 1, TTL) == []

    def test_cancel_of_a_running_task_only_marks_it(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        marked = broker.cancel(task.id)
        assert (marked.status, marked.cancel_requested) == (Status.RUNNING, True)
        assert broker.get(task.id).cancel_requested is True
        assert steps.heartbeat(broker, task.id, lease.token, TTL).cancel_requested is True

    def test_heartbeat_without_a_cancel_reports_none(self, broker: Broker) -> None:
        task = submit(broker)
        assert steps.heartbeat(broker, task.id, claim_one(broker).token, TTL).cancel_requested is False

    def test_cancel_of_a_marked_running_task_again_keeps_the_mark(self, broker: Broker) -> None:
        task = submit(broker)
        claim_one(broker)
        broker.cancel(task.id)
        again = broker.cancel(task.id)
        assert (again.status, again.cancel_requested) == (Status.RUNNING, True)

    def test_cancel_of_a_completed_task_raises_already_final(self, broker: Broker) -> None:
        task = submit(broker)
        done = steps.ack(broker, task.id, claim_one(broker).token, b"r")
        with pytest.raises(AlreadyFinalError):
            broker.cancel(task.id)
        assert broker.get(task.id) == done

    def test_cancel_of_a_failed_task_raises_already_final(self, broker: Broker) -> None:
        task = submit(broker)
        steps.fail(broker, task.id, claim_one(broker).token, kind=FailureKind.SKIP, error="x")
        with pytest.raises(AlreadyFinalError):
            broker.cancel(task.id)

    def test_cancel_of_a_canceled_task_raises_already_final(self, broker: Broker) -> None:
        task = submit(broker)
        broker.cancel(task.id)
        with pytest.raises(AlreadyFinalError):
            broker.cancel(task.id)

    def test_cancel_of_an_unknown_task_raises_task_not_found(self, broker: Broker) -> None:
        with pytest.raises(TaskNotFoundError):
            broker.cancel(new_id())

    def test_cancel_of_a_running_parent_leaves_children_blocked_until_it_ends(self, broker: Broker) -> None:
        parent = submit(broker, queue="parents")
        child = submit(broker, depends_on=(parent.id,))
        lease = claim_one(broker, "parents")
        broker.cancel(parent.id)
        assert broker.get(child.id).status is Status.BLOCKED
        steps.finish_canceled(broker, parent.id, lease.token)
        assert broker.get(child.id).status is Status.CANCELED

    def test_finish_canceled_ends_the_running_task_canceled(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.cancel(task.id)
        ended = steps.finish_canceled(broker, task.id, lease.token)
        assert (ended.status, ended.finished_at, ended.attempts) == (Status.CANCELED, clock.now(), 0)

    def test_retry_of_a_cancel_marked_task_cancels_it_with_its_children(self, broker: Broker) -> None:
        task = submit(broker, queue="parents")
        child = submit(broker, depends_on=(task.id,))
        lease = claim_one(broker, "parents")
        broker.cancel(task.id)
        ended = steps.retry(
            broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="x", delay=timedelta(0)
        )
        assert (ended.status, ended.attempts) == (Status.CANCELED, 1)
        assert broker.get(child.id).status is Status.CANCELED
        assert steps.claim(broker, "parents", 1, TTL) == []

    def test_requeue_of_a_cancel_marked_task_cancels_it(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.cancel(task.id)
        assert steps.requeue(broker, task.id, lease.token).status is Status.CANCELED
        assert steps.claim(broker, "q", 1, TTL) == []

    def test_reap_of_a_cancel_marked_task_cancels_it(self, broker: Broker, clock: ManualClock) -> None:
        task = submit(broker)
        claim_one(broker)
        broker.cancel(task.id)
        clock.advance(TTL)
        (reaped,) = broker.reap(lease_lost_max=3)
        assert (reaped.id, reaped.status) == (task.id, Status.CANCELED)
        assert steps.claim(broker, "q", 1, TTL) == []

    def test_ack_of_a_cancel_marked_task_completes_it(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.cancel(task.id)
        assert steps.ack(broker, task.id, lease.token, b"done anyway").status is Status.COMPLETED

    def test_fail_of_a_cancel_marked_task_fails_it(self, broker: Broker) -> None:
        task = submit(broker)
        lease = claim_one(broker)
        broker.cancel(task.id)
        assert (
            steps.fail(broker, task.id, lease.token, kind=FailureKind.BUSINESS, error="x").status
            is Status.FAILED
        )
