"""Contract: status on arrival with parents, wake-up of children, cascade cancel."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskgate.brokers.base import Broker, FailureKind
from taskgate.clock import ManualClock
from taskgate.errors import TaskNotFoundError
from taskgate.ids import new_id
from taskgate.task import Status, Task
from taskgate.testing import steps
from taskgate.testing.contract._support import TTL, claim_one, new_task, nonzero_counts, submit

__all__ = ["DependencyContract"]

# Parents live in their own queue so claiming one never picks up a child by accident.
PARENTS = "parents"


def _completed(broker: Broker) -> Task:
    task = submit(broker, queue=PARENTS)
    return steps.ack(broker, task.id, claim_one(broker, PARENTS).token, None)


def _failed(broker: Broker) -> Task:
    task = submit(broker, queue=PARENTS)
    return steps.fail(broker, task.id, claim_one(broker, PARENTS).token, kind=FailureKind.BUSINESS, error="x")


def _fail_running(broker: Broker, task_id: str) -> Task:
    lease = claim_one(broker, PARENTS)
    assert lease.task.id == task_id
    return steps.fail(broker, task_id, lease.token, kind=FailureKind.BUSINESS, error="parent broke")


class DependencyContract:
    """Fan-in dependencies (seed: DepWake, CascadeCancel)."""

    def test_child_of_an_unfinished_parent_arrives_blocked(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        assert submit(broker, depends_on=(parent.id,)).status is Status.BLOCKED

    def test_child_of_a_completed_parent_arrives_pending(self, broker: Broker) -> None:
        parent = _completed(broker)
        assert submit(broker, depends_on=(parent.id,)).status is Status.PENDING

    def test_child_of_a_failed_parent_arrives_canceled(self, broker: Broker, clock: ManualClock) -> None:
        child = submit(broker, depends_on=(_failed(broker).id,))
        assert (child.status, child.finished_at) == (Status.CANCELED, clock.now())

    def test_child_of_a_canceled_parent_arrives_canceled(self, broker: Broker) -> None:
        parent = broker.cancel(submit(broker, queue=PARENTS).id)
        assert submit(broker, depends_on=(parent.id,)).status is Status.CANCELED

    def test_child_ignoring_failure_of_a_failed_parent_arrives_pending(self, broker: Broker) -> None:
        child = submit(broker, depends_on=(_failed(broker).id,), ignore_parent_failure=True)
        assert child.status is Status.PENDING

    def test_child_ignoring_failure_still_waits_for_an_unfinished_parent(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,), ignore_parent_failure=True)
        assert child.status is Status.BLOCKED

    def test_child_with_one_failed_parent_arrives_canceled_even_if_another_is_unfinished(
        self, broker: Broker
    ) -> None:
        unfinished = submit(broker, queue="elsewhere")
        child = submit(broker, depends_on=(unfinished.id, _failed(broker).id))
        assert child.status is Status.CANCELED

    def test_unknown_parent_raises_task_not_found_and_stores_nothing(self, broker: Broker) -> None:
        with pytest.raises(TaskNotFoundError):
            submit(broker, depends_on=(new_id(),))
        assert nonzero_counts(broker) == {}

    def test_parent_earlier_in_the_same_batch_is_accepted(self, broker: Broker) -> None:
        parent = new_task(queue=PARENTS)
        child = new_task(depends_on=(parent.id,))
        assert [t.status for t in steps.enqueue(broker, [parent, child])] == [Status.PENDING, Status.BLOCKED]

    def test_ack_wakes_the_child_in_the_same_transition(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,))
        steps.ack(broker, parent.id, claim_one(broker, PARENTS).token, None)
        assert broker.get(child.id).status is Status.PENDING
        assert claim_one(broker).task.id == child.id

    def test_canceled_child_stays_canceled_when_its_parent_completes(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        child = broker.cancel(submit(broker, depends_on=(parent.id,)).id)
        steps.ack(broker, parent.id, claim_one(broker, PARENTS).token, None)
        assert broker.get(child.id) == child

    def test_canceled_child_is_untouched_when_its_parent_fails(
        self, broker: Broker, clock: ManualClock
    ) -> None:
        parent = submit(broker, queue=PARENTS)
        child = broker.cancel(submit(broker, depends_on=(parent.id,), ignore_parent_failure=True).id)
        clock.advance(5)
        _fail_running(broker, parent.id)
        assert broker.get(child.id) == child

    def test_fan_in_child_waits_for_every_parent(self, broker: Broker) -> None:
        first, second = submit(broker, queue=PARENTS), submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(first.id, second.id))
        (lease_1, lease_2) = steps.claim(broker, PARENTS, 2, TTL)
        steps.ack(broker, lease_1.task.id, lease_1.token, None)
        assert broker.get(child.id).status is Status.BLOCKED
        steps.ack(broker, lease_2.task.id, lease_2.token, None)
        assert broker.get(child.id).status is Status.PENDING

    def test_failed_parent_cancels_every_descendant(self, broker: Broker, clock: ManualClock) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,))
        grandchild = submit(broker, depends_on=(child.id,))
        clock.advance(3)
        _fail_running(broker, parent.id)
        for task_id in (child.id, grandchild.id):
            task = broker.get(task_id)
            assert (task.status, task.finished_at) == (Status.CANCELED, clock.now())

    def test_canceled_parent_cancels_every_descendant(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,))
        grandchild = submit(broker, depends_on=(child.id,))
        broker.cancel(parent.id)
        assert broker.get(child.id).status is Status.CANCELED
        assert broker.get(grandchild.id).status is Status.CANCELED

    def test_fan_in_child_is_canceled_when_one_parent_fails(self, broker: Broker) -> None:
        first, second = submit(broker, queue=PARENTS), submit(broker, queue="other-parents")
        child = submit(broker, depends_on=(first.id, second.id))
        _fail_running(broker, first.id)
        assert broker.get(child.id).status is Status.CANCELED
        assert broker.get(second.id).status is Status.PENDING

    def test_cascade_wakes_a_child_that_ignores_parent_failure(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        tolerant = submit(broker, depends_on=(parent.id,), ignore_parent_failure=True)
        strict = submit(broker, depends_on=(parent.id,))
        _fail_running(broker, parent.id)
        assert broker.get(tolerant.id).status is Status.PENDING
        assert broker.get(strict.id).status is Status.CANCELED

    def test_grandchild_of_a_tolerant_child_waits_for_that_child(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        tolerant = submit(broker, queue="tolerant", depends_on=(parent.id,), ignore_parent_failure=True)
        grandchild = submit(broker, depends_on=(tolerant.id,))
        _fail_running(broker, parent.id)
        assert broker.get(grandchild.id).status is Status.BLOCKED
        steps.ack(broker, tolerant.id, claim_one(broker, "tolerant").token, None)
        assert broker.get(grandchild.id).status is Status.PENDING

    def test_tolerant_child_wakes_only_when_every_parent_is_final(self, broker: Broker) -> None:
        first, second = submit(broker, queue=PARENTS), submit(broker, queue="other-parents")
        child = submit(broker, depends_on=(first.id, second.id), ignore_parent_failure=True)
        _fail_running(broker, first.id)
        assert broker.get(child.id).status is Status.BLOCKED
        steps.ack(broker, second.id, claim_one(broker, "other-parents").token, None)
        assert broker.get(child.id).status is Status.PENDING

    def test_tolerant_child_wakes_when_its_last_parent_is_canceled(self, broker: Broker) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,), ignore_parent_failure=True)
        broker.cancel(parent.id)
        assert broker.get(child.id).status is Status.PENDING

    def test_woken_child_keeps_its_own_run_at(self, broker: Broker, clock: ManualClock) -> None:
        parent = submit(broker, queue=PARENTS)
        child = submit(broker, depends_on=(parent.id,), delay=timedelta(seconds=60))
        steps.ack(broker, parent.id, claim_one(broker, PARENTS).token, None)
        assert broker.get(child.id).run_at == child.run_at
        assert steps.claim(broker, "q", 1, TTL) == []
        clock.advance(60)
        assert claim_one(broker).task.id == child.id
